r"""The profiler's shape protocols side by side, in one run: the shapes of a grid that run on cached context
(decodes, chunks, hybrids, padded decodes, insertions) timed by the profiler's own repetition loop
(`profiler.worker.Worker.measure`) under `fixed` and `served` (`profiler.shape_protocol`), in rounds
that alternate the two so a spell of load hits both; per shape, the median of each protocol's quiet blocks
(as the profile takes it) and served / fixed. A cache keyed on the shape (cuDNN's per-KV-length attention
plans on an H100, simctl issue 11) shows as served / fixed >> 1 (`--attention any` lets torch pick cuDNN).

    .venv/bin/python bench/profile_protocols.py --model tiny --device cpu --threads 2 --rounds 10
    .venv/bin/python bench/profile_protocols.py --model mistral-7b --device cuda --dtype bfloat16 --rounds 4
    .venv/bin/python bench/profile_protocols.py --model mistral-7b --device cuda --dtype bfloat16 \
        --attention any
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import time
from functools import partial

import numpy as np

from simctl.executor.config import ATTENTION
from simctl.executor.model import build_model
from simctl.executor.ragged import RaggedExecutor
from simctl.executor.runtime import default_threads
from simctl.profiler.shape_protocol import PROTOCOLS, ShapeProtocol
from simctl.profiler.sweeps import select_blocks
from simctl.profiler.timing import CpuMonitor
from simctl.profiler.worker import Worker
from simctl.profiler.workloads import Grid, build_grid


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=default_threads())
    p.add_argument("--grid", default="quick", help="the grid whose shapes on cached context are timed")
    p.add_argument("--rounds", type=int, default=10,
                   help="rounds, each timing every shape under both protocols")
    p.add_argument("--attention", default="auto", choices=list(ATTENTION), help="the executor's SDPA kernels")
    args = p.parse_args()
    if os.environ.get("OMP_WAIT_POLICY") != "PASSIVE":
        print("note: run with OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=N, as the profiler does",
              file=sys.stderr)

    workers = {name: Worker(args.model, args.device, args.dtype, args.threads, args.grid, 0, io.StringIO(),
                            name, args.attention) for name in PROTOCOLS}
    first = workers["served"]
    model = build_model(first.spec, first.device, first.dtype, seed=0)
    executor_cls = partial(RaggedExecutor, config=first.executor_config)
    kv_bpt = executor_cls(model, 1, 1).kv_bytes_per_token
    grid = build_grid(args.grid, first.spec.max_position, first.kv_budget_tokens(kv_bpt))
    shapes = [s for s in grid.shapes if any(g.c for g in s.segs)]
    monitor = CpuMonitor()
    blocks = {name: [[] for _ in shapes] for name in PROTOCOLS}
    start = time.perf_counter()
    for r in range(args.rounds):
        for name in PROTOCOLS if r % 2 == 0 else PROTOCOLS[::-1]:
            w = workers[name]
            g = Grid("bench", shapes, warmup=1, min_reps=6, max_reps=40, budget_s=0.3, passes=3,
                     protocol=ShapeProtocol(name), max_position=first.spec.max_position,
                     max_kv_tokens=grid.max_kv_tokens)
            for i, bs in enumerate(w.measure(g, model, executor_cls, monitor, float("inf"), kv_bpt)):
                blocks[name][i] += bs
        print(f"round {r + 1}/{args.rounds}: {time.perf_counter() - start:.0f} s", file=sys.stderr,
              flush=True)

    print(f"{args.model} on {first.device} ({args.dtype}, {args.threads} threads, attention "
          f"{args.attention}), grid {args.grid}, {args.rounds} rounds\n")
    print("| shape | fixed ms | served ms | served / fixed | quiet blocks fixed / served |")
    print("|---|---:|---:|---:|---:|")
    ratios: dict[str, list[float]] = {}
    for i, s in enumerate(shapes):
        med = {name: float(np.median([t for b in select_blocks(blocks[name][i]) for t in b.times]))
               for name in PROTOCOLS}
        ratio = med["served"] / med["fixed"]
        ratios.setdefault(s.kind, []).append(ratio)
        quiet = " / ".join(str(sum(b.quiet for b in blocks[name][i])) for name in ("fixed", "served"))
        print(
            f"| {s.label()} | {med['fixed'] * 1e3:.3f} | {med['served'] * 1e3:.3f} | {ratio:.3f} | {quiet} |")
    print("\n| kind | shapes | geometric mean served / fixed |\n|---|---:|---:|")
    for kind, v in ratios.items():
        print(f"| {kind} | {len(v)} | {np.exp(np.mean(np.log(v))):.3f} |")


if __name__ == "__main__":
    main()
