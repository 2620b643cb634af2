"""Why does simctl's vLLM reach no more capacity than its Orca in Sarathi-Serve's Figure 9 setting
(Mistral-7B, one A100-80GB, sharegpt, P99 TBT 0.1 s, median scheduling delay <= 2 s), where the paper has
vLLM ~1.56x Orca?

    python research/sarathi_vllm_orca.py [--requests N] [--execution cuda-graph|eager]
        [--part probes|knobs|both] [--seeds K]

Part `probes`: both systems at a few rates around their capacity, one run each, with what each run's
iterations show: the share of token gaps over 0.1 s, prefill iterations per second against decode iterations
per second (a prefill stalls every running decode once, so the stalled share of gaps is about their ratio,
whatever the batch size), prompts per prefill iteration, the decode batch reached, KV use and preemptions.
Part `knobs`: the capacity (the study's bisection) with the settings the issue names changed one at a time:
Orca's batch limit (16, simctl's default; 56, what its max-length reservation admits; 128, the Sarathi-Serve
artifact's default `max_num_seqs`), vLLM's batch limit and its prompt tokens per prefill iteration.
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from math import log10, nan

import numpy as np

from simctl.costs.kv_capacity import KVSizing
from simctl.results.slo import parse_slo
from simctl.serving.records import GapHistogram
from simctl.sim.run import RunConfig, run
from simctl.studies.capacity import CapacityConfig, search_capacities
from simctl.traces.workload import Workload

SLO_TBT = 0.1


def base(policy: str, qps: float, requests: int, execution: str, **options: int) -> RunConfig:
    return RunConfig(policy=policy, model="mistral-7b", gpu="a100-80gb", execution=execution, options=options,
                     workload=Workload(trace="sharegpt", qps=qps, num_requests=requests))


def share_over(gaps: GapHistogram, limit: float) -> float:
    """Share of token gaps longer than `limit` seconds (read off the histogram's bins)."""
    counts = gaps.counts
    first = int((log10(limit) - gaps.LOW_EXP) * gaps.PER_DECADE)
    return float(counts[first:].sum()) / max(1, int(counts.sum()))


def probe(config: RunConfig) -> dict[str, float]:
    r = run(config)
    s, it = r.summary, r.iterations
    n = it["count"].to_numpy()
    pre = it["prefill_tokens"].to_numpy() > 0
    prompts = (it["batch_size"] - it["decode_tokens"] // n).to_numpy()  # rows in a prefill iteration
    dec = ~pre
    busy = it["duration_s"].sum()
    return {
        "qps": config.workload.qps, "tbt_p99": s["tbt_p99"], "sched_p50": s["sched_delay_p50"],
        "gaps_over_0.1": share_over(r.result.gaps, SLO_TBT),
        "prefill_it_per_s": pre.sum() / s["makespan_s"],
        "decode_it_per_s": n[dec].sum() / s["makespan_s"],
        "prefill_over_0.1_per_s": (pre & (it["duration_s"].to_numpy() > SLO_TBT)).sum() / s["makespan_s"],
        "prompts_per_prefill_it": float(prompts[pre].mean()) if pre.any() else 0.0,
        "prompt_tokens_per_prefill_it": float(it["prefill_tokens"][pre].mean()) if pre.any() else 0.0,
        "decode_batch_mean": float(np.average(it["batch_size"][dec], weights=n[dec])) if dec.any() else 0.0,
        "batch_max": int(it["batch_size"].max()), "busy_share": busy / s["makespan_s"],
        "kv_peak": s["kv_peak_tokens"], "kv_capacity": s["kv_capacity_tokens"],
        "preemptions": s["preemptions"],
    }


def prefill_threshold(requests: int, execution: str) -> list[str]:
    """From vLLM's lone-prompt prefill iterations at a light load: the prompt length whose prefill alone
    takes the SLO's 0.1 s, and the share of the trace's prompts (one per such iteration) longer than it."""
    it = run(base("vllm", 0.3, requests, execution)).iterations
    lone = it[(it["prefill_tokens"] > 0) & (it["batch_size"] == 1)]
    slow = lone[lone["duration_s"] > SLO_TBT]["prefill_tokens"]
    fast = lone[lone["duration_s"] <= SLO_TBT]["prefill_tokens"]
    head = (f"### lone prefills ({execution}): {len(lone)} iterations; the longest prompt within "
            f"{SLO_TBT} s: {fast.max()} tokens, the shortest over it: {slow.min()} tokens; "
            "share of prompts over it: "
            f"{len(slow) / len(lone):.3f}; prompt tokens median {lone['prefill_tokens'].median():.0f}")
    return [head, ""]


def probes(requests: int, execution: str) -> list[str]:
    cols = ["qps", "tbt_p99", "sched_p50", "gaps_over_0.1", "prefill_it_per_s", "decode_it_per_s",
            "prefill_over_0.1_per_s", "prompts_per_prefill_it", "prompt_tokens_per_prefill_it",
            "decode_batch_mean", "batch_max", "busy_share", "kv_peak", "preemptions"]
    lines = [f"### probes ({execution}, {requests} requests)", "",
             "| system | " + " | ".join(cols) + " |", "|---|" + "---:|" * len(cols)]
    for policy, opts in (("orca", {}), ("orca", {"max_batch_size": 128}), ("vllm", {}),
                         ("vllm", {"max_tokens": 4096})):
        for qps in (0.6, 0.9, 1.2, 1.5, 2.0):
            row = probe(base(policy, qps, requests, execution, **opts))
            name = policy + "".join(f" {k}={v}" for k, v in opts.items())
            lines.append(f"| {name} | " + " | ".join(
                f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in cols) + " |")
    return lines


KNOBS = [("orca", {"max_batch_size": 4}), ("orca", {"max_batch_size": 6}), ("orca", {"max_batch_size": 8}),
         ("orca", {"max_batch_size": 12}), ("orca", {}), ("orca", {"max_batch_size": 128}),
         ("vllm", {}), ("vllm", {"max_batch_size": 16}), ("vllm", {"max_tokens": 4096}),
         ("vllm", {"max_tokens": 2048})]


# Orca held to k max-length reservations by its KV cache (the trace's 8,192-token cap each) with the
# artifact's batch limit of 128: the memory route to a small batch, as an activation reserve for batch x max
# length would leave the artifact's Orca
KV_BOUND = (6, 8, 14)
RESERVATION = 8192


def knobs(requests: int, execution: str, workers: int | None, seeds: int) -> list[str]:
    slo = replace(parse_slo([f"p99_tbt={SLO_TBT}"]), definition="paper")
    configs = [base(p, 1.0, requests, execution, **o) for p, o in KNOBS]
    labels = [p + "".join(f" {k}={v}" for k, v in o.items()) for p, o in KNOBS]
    for k in KV_BOUND:
        configs.append(replace(base("orca", 1.0, requests, execution, max_batch_size=128),
                               kv_sizing=KVSizing(kv_cache_tokens=k * RESERVATION)))
        labels.append(f"orca max_batch_size=128 kv_cache_tokens={k}x{RESERVATION}")
    found = search_capacities(CapacityConfig(configs, {"strict": slo}, workers=workers, labels=labels,
                                                 seeds=seeds))
    lines = [f"### capacity by knob ({execution}, {requests} requests a probe, median of {seeds} seeds)", "",
             ("| configuration | capacity QPS | bound by (lowest failing probe) | P99 TBT at capacity | "
              "median sched delay at capacity |"), "|---|---:|---|---:|---:|"]
    for c in found:
        m = c.median_search
        at = m.at_capacity or {}
        lines.append(f"| {c.label} | {c.qps:.3g} | {', '.join(m.bound_by) or '-'} | "
                     f"{at.get('tbt_p99', nan):.3f} | {at.get('sched_delay_p50', nan):.3f} |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--execution", default="cuda-graph", choices=("cuda-graph", "eager"))
    ap.add_argument("--part", default="both", choices=("probes", "knobs", "both"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seeds", type=int, default=1, help="capacity searches per knob (their median)")
    args = ap.parse_args()
    lines: list[str] = []
    if args.part in ("probes", "both"):
        lines += prefill_threshold(args.requests, args.execution)
        lines += probes(args.requests, args.execution) + [""]
    if args.part in ("knobs", "both"):
        lines += knobs(args.requests, args.execution, args.workers, args.seeds)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
