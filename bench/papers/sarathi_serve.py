"""Sarathi-Serve (Agrawal et al., OSDI 2024; seeds/002) reproduced: Figure 9's capacity (Mistral-7B, one
A100-80GB, openchat_sharegpt4, strict SLO) and Table 4's ablation (Yi-34B, TP2 on A100s, 128 requests, token
budget 1024), the published numbers beside the predictions. Writes bench/results/papers/sarathi_serve.md.

    python bench/papers/sarathi_serve.py [--part capacity|table4|both] [--probe-requests N] [--workers K]

The setting as written: Table 3's strict SLO for Mistral-7B (P99 TBT 0.1 s) and the capacity rule of Section 5
(the highest load whose median scheduling delay stays within 2 s: `--capacity-definition paper`), token budget
512 under the strict SLO; Poisson arrivals over the traces of Table 2; Yi-34B in TP2. Table 4's arxiv prompts
reach 16K tokens, past the catalogue's Yi-34B (4K positions): the study serves Yi-34B-200K's shape
(bench/models/yi-34b-200k.json), which the paper's runs must have used.

Execution mode: eager for every system. The paper ran Orca, vLLM and Sarathi-Serve as schedulers of one engine
(microsoft/sarathi-serve: sarathi/core/scheduler/ holds all of them), whose model runner calls the model
directly each step with no CUDA-graph capture (sarathi/model_executor/model_runner.py: `run`).

Table 4 gives no arrival rate: the study takes, on a grid, the rate at which the combined system's P50 TTFT
is nearest the paper's (one free parameter, fitted on one number) and compares both ablations at that rate.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace
from pathlib import Path

from paper_results import misses_section, publish, ratio

from simctl.results.slo import parse_slo
from simctl.sim.run import RunConfig, run
from simctl.studies.capacity import CapacityConfig, search_capacities
from simctl.traces.workload import Workload

YI = str(Path(__file__).resolve().parents[1] / "models" / "yi-34b-200k.json")

# Figure 9 (strict SLO, Mistral-7B, sharegpt), as ratios (the bars are not in the text; issue 38 reads them)
CAPACITY_RATIOS = {"sarathi / vllm": 1.8, "sarathi / orca": 2.8}
# Table 4: P50 TTFT and P99 TBT, seconds
TABLE4 = {"sharegpt": {"sarathi-hybrid-only": (0.56, 1.08), "sarathi-chunked-only": (1.04, 0.34),
                       "sarathi": (0.85, 0.29)},
          "arxiv": {"sarathi-hybrid-only": (4.18, 1.76), "sarathi-chunked-only": (4.86, 0.38),
                    "sarathi": (3.03, 0.35)}}
RATES = {"sharegpt": [round(0.25 * i, 2) for i in range(4, 17)],
         "arxiv": [round(0.05 * i, 2) for i in range(6, 15)]}


def capacities(probe_requests: int, workers: int | None, execution: str) -> dict[str, float]:
    """Each system's strict-SLO capacity (QPS) on Mistral-7B / one A100, sharegpt."""
    slo = replace(parse_slo(["p99_tbt=0.1"]), definition="paper")
    base = RunConfig(model="mistral-7b", gpu="a100-80gb", execution=execution,
                     workload=Workload(trace="sharegpt", qps=1.0, num_requests=probe_requests))
    configs = [replace(base, policy=p, options={"token_budget": 512} if p == "sarathi" else {})
               for p in ("orca", "vllm", "sarathi")]
    found = search_capacities(CapacityConfig(configs, {"strict": slo}, workers=workers))
    return {c.policy: c.qps for c in found}


def table4_run(policy: str, trace: str, qps: float, execution: str = "eager") -> tuple[float, float]:
    """P50 TTFT and P99 TBT of 128 requests on Yi-34B(-200K), TP2 on A100s, token budget 1024."""
    # allreduce "nccl": the paper's 2023 engines had no custom all-reduce (vLLM's came in 2024)
    s = run(RunConfig(policy=policy, model=YI, gpu="a100-80gb", tp=2, options={"token_budget": 1024},
                      allreduce="nccl",
                      max_model_len=16384, execution=execution,
                      workload=Workload(trace=trace, qps=qps, num_requests=128))).summary
    return s["ttft_p50"], s["tbt_p99"]


def table4(trace: str) -> tuple[float, dict[str, tuple[float, float]]]:
    """The rate whose combined P50 TTFT is nearest the paper's, and every system's numbers there."""
    want = TABLE4[trace]["sarathi"][0]
    qps = min(RATES[trace], key=lambda q: abs(table4_run("sarathi", trace, q)[0] - want))
    return qps, {p: table4_run(p, trace, qps) for p in TABLE4[trace]}


def capacity_section(probe_requests: int, workers: int | None) -> list[str]:
    lines = ["## Figure 9: capacity, Mistral-7B on one A100, sharegpt, strict SLO (P99 TBT 0.1 s)", "",
             (f"{probe_requests} requests a probe; capacity rule: median scheduling delay <= 2 s and the SLO "
             "(`--capacity-definition paper`); sarathi's token budget 512."), "",
             ("| execution | orca QPS | vllm QPS | sarathi QPS | sarathi / vllm (paper 1.8) | "
             "sarathi / orca (paper 2.8) |"), "|---|---:|---:|---:|---:|---:|"]
    for execution in ("eager", "cuda-graph"):
        c = capacities(probe_requests, workers, execution)
        mode = f"{execution} (the paper's)" if execution == "eager" else execution
        lines.append(f"| {mode} | {c['orca']:.3g} | {c['vllm']:.3g} | {c['sarathi']:.3g} | "
                     f"{c['sarathi'] / c['vllm']:.2f} (ratio {ratio(c['sarathi'] / c['vllm'], 1.8)}) | "
                     f"{c['sarathi'] / c['orca']:.2f} (ratio {ratio(c['sarathi'] / c['orca'], 2.8)}) |")
    return lines


def table4_section() -> list[str]:
    lines = ["## Table 4: ablation, Yi-34B(-200K) TP2 on A100s, 128 requests, token budget 1024, eager", "",
             ("| trace | rate (QPS, fitted) | system | P50 TTFT s (paper) | ratio | P99 TBT s (paper) | "
             "ratio |"),
             "|---|---:|---|---:|---:|---:|---:|"]
    for trace in TABLE4:
        qps, got = table4(trace)
        for p, (ttft, tbt) in got.items():
            pt, pb = TABLE4[trace][p]
            lines.append(f"| {trace} | {qps:g} | {p} | {ttft:.2f} ({pt}) | {ratio(ttft, pt)} | {tbt:.3f} "
                         f"({pb}) | {ratio(tbt, pb)} |")
    return lines


MISSES = [
    (
        "**Capacity, eager: vLLM and Orca fall further than the paper's.** simctl's eager launch floor "
        "(22 ms a step for 32 layers, measured on vLLM on an H100) makes a Mistral-7B decode iteration of"
        " 32 requests at 4K context cost 24.0 ms, where Table 3's own strict SLO (0.1 s = 5 x that "
        "iteration) says the paper's engine ran it in 20 ms; the roofline with CUDA-graph overheads gives"
        " 21.9 ms (and 39.7 ms for Yi-34B TP2 against Table 3's 40 ms), so the paper's engine hid its "
        "launches behind the GPU at that batch, and the eager floor overstates its steps: every decode "
        "step of vLLM and Orca grows, the prefill stalls become a larger share of their gaps, and their "
        "P99 TBT reaches 0.1 s at a lower rate."
    ),
    (
        "**Capacity: vLLM equals Orca here, where the paper has vLLM about 1.56x Orca (2.8 / 1.8).** Both"
        " are bound by the P99 TBT of prefill stalls, one prompt per prefill iteration in both (1.01-1.09),"
        " so the stalled share of token gaps is prefill over decode iterations per second whatever the "
        "batch; Orca held to about 6 requests at once (by its batch or its KV) gives vLLM / Orca 1.53-1.58,"
        " as the artifact's Orca sizing (max_num_batched_tokens = max_num_seqs x max_model_len, an "
        "activation reserve that would shrink its KV; not checked in its code) plausibly did "
        "(research/results/sarathi_vllm_orca.md)."
    ),
    (
        "**Table 4, P99 TBT 0.69-0.74x for the chunked systems.** A 1024-token iteration of Yi-34B on two "
        "A100s costs the roofline ~0.2-0.24 s, the paper ~0.29-0.35 s (the combined system's P99 TBT is "
        "one such iteration): the roofline's efficiencies for that shape, not the scheduling (chunked-only "
        "over combined is 1.18x and 1.16x here, 1.17x and 1.09x in the paper). Hybrid-only's TBT, one "
        "whole prompt's prefill, is 0.80x (sharegpt) and 1.31x (arxiv, its 7K-token prompts)."
    ),
    (
        "**Table 4, arxiv: hybrid-only's P50 TTFT is below the combined system's (the paper: above).** "
        "simctl's hybrid-only prefills each arxiv prompt whole in one iteration at full-prompt "
        "efficiency, the combined system in 1024-token chunks that each re-read the prompt's KV; what "
        "made the paper's hybrid-only slower to the first token (its artifact's configuration of that "
        "ablation is not in the material) is not measured here."
    ),
    (
        "**Table 4, arxiv: chunked-only's P50 TTFT 1.6x the paper's.** At the rate fitted to the combined"
        " system, chunked-only (a prefill chunk, then a decode iteration, each paying the weights' read) "
        "is past its own capacity (its run is backlogged), where TTFT grows steeply with the rate."
    ),
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("capacity", "table4", "both"), default="both")
    ap.add_argument("--probe-requests", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Sarathi-Serve reproduced ({started}; `python bench/papers/sarathi_serve.py`)", ""]
    if args.part in ("capacity", "both"):
        lines += capacity_section(args.probe_requests, args.workers) + [""]
    if args.part in ("table4", "both"):
        lines += table4_section() + [""]
    if args.part == "both":
        publish("sarathi_serve", lines + misses_section(MISSES))
    else:  # a part alone is printed only
        print("\n".join(lines))


if __name__ == "__main__":
    main()
