"""The executor's attention settings (`--attention`) side by side on one device, in one run: each shape timed
under every setting the device has, the settings interleaved and repeated, medians reported as ratios to
`auto`. A decode step is timed twice: with its contexts fixed (as a profile repeating one shape) and with
them growing by one token per step (as serving): a kernel with per-length plans (cuDNN on an H100, simctl
issue 11) shows as growing / fixed >> 1.

    .venv/bin/python bench/attention_kernels.py --model tiny --device cpu --reps 9
    .venv/bin/python bench/attention_kernels.py --model mistral-7b --device cuda --dtype bfloat16
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.executor.config import ATTENTION, ExecutorConfig
from simctl.executor.model import build_model
from simctl.executor.ragged import RaggedExecutor, Segment, attention_kernels

STEPS = 8  # calls per timing (a decode "step" sequence: contexts fixed, or growing by one per call)


def shapes(rows: int, context: int) -> dict[str, Callable[[RaggedExecutor, int], object]]:
    """Shape name -> call(executor, step): `step` moves the contexts of the growing shapes."""
    def decode(mixed: bool, grow: bool) -> Callable[[RaggedExecutor, int], object]:
        return lambda ex, k: ex.run([Segment(i, [1], context + (i % 7) * mixed + k * grow)
                                     for i in range(rows)])

    return {
        f"decode {rows} x {context}, fixed": decode(False, False),
        f"decode {rows} x {context}, growing": decode(False, True),
        f"decode {rows} x ~{context} mixed, fixed": decode(True, False),
        f"decode {rows} x ~{context} mixed, growing": decode(True, True),
        f"prefill {context}": lambda ex, k: ex.run([Segment(0, [1] * context)]),
        f"chunk {context // 4} on {context}": lambda ex, k: ex.run(
            [Segment(0, [1] * (context // 4), context)]),
        f"padded dense {rows // 4} x {context // 4}": lambda ex, k: ex.run_padded(
            [Segment(i, [1] * (context // 8 + i)) for i in range(rows // 4)], length=context // 4,
            dense=True),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--rows", type=int, default=32)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--reps", type=int, default=9)
    args = p.parse_args()
    model = build_model(get_model(args.model), args.device, args.dtype, 0)
    sync = torch.cuda.synchronize if model.device.type == "cuda" else (lambda: None)
    executors = {}
    for name in ATTENTION:
        config = ExecutorConfig(name)
        try:
            kernels = attention_kernels(model, config)
        except InputError as e:  # not on this device, or no kernel for a kind
            print(f"{name}: skipped ({e})")
            continue
        print(f"{name}: {kernels}")
        executors[name] = RaggedExecutor(model, args.rows, 2 * args.context + STEPS * args.reps + 16, config)
    table = shapes(args.rows, args.context)
    times: dict[str, dict[str, list[float]]] = {s: {n: [] for n in executors} for s in table}
    for rep in range(args.reps):
        for shape, call in table.items():
            for name, ex in executors.items():
                call(ex, 0)  # warm: the growing shapes' first length is never timed again
                sync()
                t = time.perf_counter()
                for k in range(STEPS):
                    call(ex, 1 + rep * STEPS + k)
                sync()
                times[shape][name].append((time.perf_counter() - t) / STEPS)
    names = list(executors)
    print(f"\n{args.model} on {model.device} in {args.dtype}, median of {args.reps} repetitions of {STEPS} "
          "calls; ms under auto, the other settings as a ratio to it")
    print(f"{'shape':40s}" + "".join(f"{n:>10s}" for n in names))
    for shape, by in times.items():
        base = statistics.median(by["auto"])
        print(f"{shape:40s}{base * 1e3:8.2f}ms" + "".join(
            f"{statistics.median(by[n]) / base:10.3f}" for n in names if n != "auto"))


if __name__ == "__main__":
    main()
