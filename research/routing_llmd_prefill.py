"""Is the simulated llm-d experiment's excess for the cache-blind routers a prefill price?

Per stage (bench/results/routing.md), random's and load's output tok/s run 21% and 29% above the published
rows while the prefix routers' run within 8-10%: the cache-blind routers compute ~82% of their prompt
tokens, the precise router ~4%, so a prefill priced too cheap would show as exactly this split. Issue 39's
served-vLLM data on an H100 bound how cheap (bench/results/gpu_serving.md): its long prompts alone on the
GPU, compute-bound, have their TTFT 4.0% low (CodeLlama-34B) and 0.8% high (Llama-2-7B). This reruns the
bench's workload with the roofline's compute efficiencies (`mfu`, `attn_mfu`) divided by k, which slows
compute-bound work (prefill) by about k and leaves memory-bound decode steps nearly as they were, and prints
each router's mean output tok/s, its mean absolute error per stage against the published rows, precise over
random, and load against random. k = 1 is the bench's own run (the same numbers as
bench/results/routing.md).

Usage: python research/routing_llmd_prefill.py [--scales 1,1.15,1.3] [--routers random,load,prefix]
Writes research/results/routing_llmd_prefill.md.
"""

from __future__ import annotations

import argparse
import datetime
from pathlib import Path

import numpy as np
from routing_load_random import bench_module

from simctl.costs.roofline import DEFAULT_ATTN_MFU, Roofline

OUT = Path(__file__).resolve().parents[1] / "research" / "results" / "routing_llmd_prefill.md"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scales", default="1,1.15,1.3", help="k: compute efficiencies divided by k")
    parser.add_argument("--routers", default="random,load,prefix")
    args = parser.parse_args()
    bench = bench_module()
    reqs, stage_of = bench.requests(bench.STAGES)
    base = Roofline(bench.MODEL, bench.GPU, tp=bench.TP)
    command = f"python research/routing_llmd_prefill.py --scales {args.scales} --routers {args.routers}"
    lines = [f"# Prefill price and the llm-d experiment ({datetime.date.today()})", "",
             (f"`{command}` (the question and method: its docstring). Roofline mfu {base.mfu}, attn_mfu "
              f"{DEFAULT_ATTN_MFU}, each divided by k."), "",
             "| k | router | output tok/s (published) | per-stage error | P90 TTFT s (published) | hits |",
             "|---:|---|---:|---:|---:|---:|"]
    for k in (float(x) for x in args.scales.split(",")):
        cost = Roofline(bench.MODEL, bench.GPU, tp=bench.TP, mfu=base.mfu / k, attn_mfu=DEFAULT_ATTN_MFU / k)
        got = {}
        for router in args.routers.split(","):
            r = got[router] = bench.serve(router, reqs, stage_of, bench.STAGES, cost=cost)
            _, _, tok, p90 = bench.ROUTERS[router]
            error = np.mean(np.abs(np.array(r.stage_tok_s) / bench.PUBLISHED_STAGES[router][0] - 1))
            lines.append(f"| {k:g} | {router} | {r.tok_s:,.0f} ({tok:,.0f}) | {error:.0%} | {r.ttft_p90:.3g} "
                         f"({p90:.3g}) | {r.hit_rate:.1%} |")
            print(lines[-1], flush=True)
        notes = []
        if "prefix" in got and "random" in got:
            notes.append(f"precise / random {got['prefix'].tok_s / got['random'].tok_s:.2f} (published 1.97)")
        if "load" in got and "random" in got:
            d = np.divide(got["load"].stage_tok_s, got["random"].stage_tok_s) - 1
            notes.append(f"load over random per stage: mean {d.mean():+.1%}, load ahead in {(d > 0).sum()} "
                         f"of {len(d)} (published -3.6%, 7 of 16)")
        lines.append(f"| {k:g} | | {'; '.join(notes)} | | | |")
    OUT.write_text("\n".join(lines) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
