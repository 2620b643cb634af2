"""Which served decode steps cost more than a vLLM fit prices them: closed batches of decodes served through
`AsyncLLM`, all arriving at once, (a) every request at the same context (the profile's served stage), (b) at
unequal contexts (prompts spread evenly), (c) requests leaving one by one (outputs spread evenly), (d) both.
For each, the steps where every running request decodes and that continue a busy engine
(`profiler.vllm_stream.stream_steps`), their served periods over the fit's price of the same shapes, by batch.

    .venv/bin/python research/vllm_decode_mix.py --cost PROFILE/cost_model.json [--batch 32] [--repeats 3]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

PROMPT, OUTPUT = 192, 40  # the served stage's closed batches
SPREAD_PROMPTS = (32, 900)  # (b), (d): prompts spread evenly over this range
SPREAD_OUTPUTS = (10, 70)  # (c), (d): outputs spread evenly over this range (mean 40)


def batches(n: int) -> dict[str, list[tuple[int, int]]]:
    """Each case's (prompt, output) per request."""
    prompts = np.linspace(*SPREAD_PROMPTS, n).round().astype(int).tolist()
    outputs = np.linspace(*SPREAD_OUTPUTS, n).round().astype(int).tolist()
    return {"same context": [(PROMPT, OUTPUT)] * n,
            "unequal contexts": [(p, OUTPUT) for p in prompts],
            "requests leaving": [(PROMPT, o) for o in outputs],
            "both": list(zip(prompts, outputs[::-1]))}


def main() -> None:
    from simctl.costs.fitted import Fitted
    from simctl.engine.vllm_real import VLLMServer, vllm_args_for
    from simctl.profiler.vllm_stream import stream_steps
    from simctl.traces.request import Request

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cost", required=True, type=Path)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cost = Fitted.load(a.cost)
    print(f"| case (batch {a.batch}) | steps | decode rows mean | served / priced | served ms per step "
          "(median) |\n|---|---|---|---|---|")
    with VLLMServer("tiny", vllm_args_for("tiny", 0, {})) as server:
        server.serve([Request(i, 0.0, PROMPT, OUTPUT) for i in range(a.batch)])  # warm-up, discarded
        for case, shapes in batches(a.batch).items():
            requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(shapes)]
            steps = []
            for _ in range(a.repeats):
                run = server.serve(requests, members=True)
                steps += [s for s in stream_steps(run, {r.id: r.prompt_tokens for r in requests})[0]
                          if not s.prefills]
            period = np.array([s.period_s for s in steps])
            price = np.array([cost.iteration_time(s.plan()) for s in steps])
            rows = np.mean([len(s.decode_contexts) for s in steps])
            print(f"| {case} | {len(steps)} | {rows:.1f} | {period.sum() / price.sum():.3f} | "
                  f"{np.median(period) * 1e3:.2f} |", flush=True)


if __name__ == "__main__":
    main()
