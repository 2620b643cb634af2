"""Closed-loop concurrency sweep (issue 37), InferenceX's plot: output tokens/s per GPU against output
tokens/s per user, one point per concurrency (`vllm bench serve --max-concurrency N --request-rate inf`:
every request ready at t=0, N clients). Llama-3-8B on an H100 (roofline), sharegpt lengths, 1,000 requests
per point; tokens/s per user is 1 / median TPOT, the rate a streaming user sees once the first token came.
Writes bench/results/concurrency_sweep.png and prints a Markdown table for bench/results/sessions.md.

Usage: python bench/concurrency_sweep.py [--requests N]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import matplotlib

from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload

matplotlib.use("Agg")
import matplotlib.pyplot as plt

OUT = Path(__file__).resolve().parent / "results" / "concurrency_sweep.png"
POLICIES = ("vllm-v1", "sarathi")
CONCURRENCY = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    args = ap.parse_args()
    print("| policy | concurrency | requests/s | output tok/s per GPU | tok/s per user (1 / P50 TPOT) | "
          "P50 TTFT s | in flight (mean) |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    fig, ax = plt.subplots(figsize=(6.5, 4.5), constrained_layout=True)
    for policy in POLICIES:
        points = []
        for n in CONCURRENCY:
            s = run(RunConfig(policy=policy, model="llama-3-8b", gpu="h100", workload=Workload(
                trace="sharegpt", qps=None, num_requests=args.requests, concurrency=n))).summary
            per_gpu, per_user = s["throughput_tokens_per_s"] / s["gpus"], 1 / s["tpot_p50"]
            points.append((per_user, per_gpu, n))
            print(f"| {policy} | {n} | {s['throughput_rps']:.2f} | {per_gpu:.0f} | {per_user:.1f} | "
                  f"{s['ttft_p50']:.3f} | {s['in_flight_mean']:.1f} |")
        ax.plot([p[0] for p in points], [p[1] for p in points], "o-", label=policy)
        for x, y, n in points:
            ax.annotate(str(n), (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
    ax.set_xlabel("output tokens/s per user (1 / P50 TPOT)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.set_title("Llama-3-8B on H100 (roofline), sharegpt, closed loop: concurrency labelled", fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.savefig(OUT, dpi=110)
    print(f"\nwrote {OUT}")


if __name__ == "__main__":
    main()
