"""Why does llm-d's load-aware scheduling (queue and KV-utilisation scorers, 1:1) beat random routing in the
simulated llm-d experiment (bench/routing_llmd.py) when the published run has them level?

Runs the experiment's workload behind `random` with several router seeds (how far apart two random runs are)
and behind `load` with its replicas' state seen as scraped every `lag` seconds (0: exact; llm-d's endpoint
picker refreshes its metrics every 50 ms by default, vLLM's gauges move once per engine step), and prints
each run's inference-perf output tokens/s, generated tokens/s and P90 TTFT.

Usage: python research/routing_load_random.py [--output 430] [--seeds 0,1,2,3] [--lags 0,0.05,0.5,2]
       [--open-loop]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def bench_module():
    spec = importlib.util.spec_from_file_location("routing_llmd", ROOT / "bench" / "routing_llmd.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["routing_llmd"] = module
    spec.loader.exec_module(module)
    return module


def rows_in_pool(run: Callable[..., dict], todo: list[tuple], jobs: int, header: str,
                 row: Callable[[dict], str]) -> list[dict]:
    """`run(*args)` for each args of `todo` in `jobs` processes, printing `header` then each result's `row`
    as it comes (the studies that import this module run many seeds of the bench's workload)."""
    print(header, flush=True)
    rows = []
    with ProcessPoolExecutor(jobs) as pool:
        for r in pool.map(run, *zip(*todo)):
            rows.append(r)
            print(row(r), flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", type=int, default=430)
    parser.add_argument("--seeds", default="0,1,2,3", help="random's router seeds")
    parser.add_argument("--lags", default="0,0.05,0.5,2", help="load's scrape intervals, seconds")
    parser.add_argument("--workload-seed", type=int, default=0)
    parser.add_argument("--open-loop", action="store_true", help="stages back to back (its first run)")
    args = parser.parse_args()
    bench = bench_module()
    reqs, stage_of = bench.requests(bench.STAGES, args.output, args.workload_seed)
    runs = [("random", f"seed {s}", {"seed": int(s)}) for s in args.seeds.split(",")]
    runs += [("load", f"lag {lag} s", {"lag": float(lag)}) for lag in args.lags.split(",")]
    print("| router | variant | output tok/s | generated tok/s | P90 TTFT s | mean TTFT s | hit rate |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for router, label, how in runs:
        r = bench.serve(router, reqs, stage_of, bench.STAGES, not args.open_loop, how.get("lag", 0.0),
                        how.get("seed", 0))
        print(f"| {router} | {label} | {r.tok_s:,.0f} | {r.made_tok_s:,.0f} | {r.ttft_p90:.4g} | "
              f"{r.ttft_mean:.4g} | {r.hit_rate:.1%} |", flush=True)
        print(f"<!-- {router} {label} stages: {np.round(r.stage_tok_s).astype(int).tolist()} -->", flush=True)


if __name__ == "__main__":
    main()
