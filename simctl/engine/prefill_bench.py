"""`simctl prefill-bench --real`: the prefills a policy plans (`studies.prefill_bench.serve_prefills`), run on
this machine's engine (random weights, greedy sampling), each timed as one synchronized forward. The same
plans are priced by the cost model, so measured and predicted prefill times compare batch for batch."""

from __future__ import annotations

import statistics
import time

import numpy as np

from simctl.catalogue.models import ModelSpec
from simctl.studies.prefill_bench import serve_prefills

DTYPE = "float32"


def check_memory(spec: ModelSpec, pools: list[np.ndarray], batch_size: int, device: str) -> None:
    """Before building: the model, the executor's slab (a batch of the longest prompt) and a padded prefill
    of that batch against the device's memory (InputError)."""
    from simctl.executor.memory import check_fits

    longest = max(int(p.max()) for p in pools)
    check_fits(spec, DTYPE, batch_size * (longest + 1), batch_size * longest, device)


def measure_prefills(policy_name: str, lengths: np.ndarray, batch_size: int, model: ModelSpec, device: str,
                     batches: int, repeats: int, seed: int = 0) -> list[float]:
    """Median seconds over `repeats` of each of the first `batches` prefill forwards the policy plans."""
    from simctl.engine.serve import prompt_ids  # torch: imported once the memory check has passed
    from simctl.executor.model import build_model
    from simctl.executor.plans import PlanExecutor
    from simctl.executor.ragged import RaggedExecutor

    net = build_model(model, device, DTYPE, seed)
    executor = RaggedExecutor(net, batch_size, int(lengths.max()) + 1)
    prompts = {i: prompt_ids(i, int(n), model.vocab_size, seed) for i, n in enumerate(lengths.tolist())}
    runs: list[list[float]] = []
    for _ in range(repeats + 1):  # the first pass warms the allocator and thread pools, and is dropped
        engine = PlanExecutor(executor, prompts)
        times = []
        plans = serve_prefills(policy_name, lengths, batch_size)
        previous = None
        for plan in plans:
            if previous is not None:  # applied by now: each prompt sampled its only token and finished
                engine.release(previous.seqs)
            t0 = time.perf_counter()
            engine.execute(plan)
            times.append(time.perf_counter() - t0)
            if len(times) == batches:
                plans.close()
                break
            previous = plan
        runs.append(times)
    return [statistics.median(r[i] for r in runs[1:]) for i in range(len(runs[0]))]
