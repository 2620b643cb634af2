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

Table 4 as the paper's artifact ran it (microsoft/sarathi-serve, branch osdi-sarathi-serve,
osdi-experiments/table-6/scheduling_ablation.sh): Poisson arrivals at 1 QPS (sharegpt) and 0.5 QPS
(arxiv), max model length 8,192 and 16,384, batch up to 128; the combined system and chunked-prefills-only
at chunk size 512 (the caption says a token budget of 1024: both are shown), hybrid-batching-only at a chunk
size of the max model length. A 128-request run near the arxiv systems' capacity varies much with the
arrivals' draw: the median over seeds 0-4 is compared, and the P50 TTFT's range shown.
"""

from __future__ import annotations

import argparse
import statistics
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
RATES = {"sharegpt": 1.0, "arxiv": 0.5}  # the artifact's scheduling_ablation.sh
MAX_LEN = {"sharegpt": 8192, "arxiv": 16384}
BUDGETS = (512, 1024)  # the artifact's chunk size; the caption's token budget
SEEDS = range(5)


def capacities(probe_requests: int, workers: int | None, execution: str) -> dict[str, float]:
    """Each system's strict-SLO capacity (QPS) on Mistral-7B / one A100, sharegpt."""
    slo = replace(parse_slo(["p99_tbt=0.1"]), definition="paper")
    base = RunConfig(model="mistral-7b", gpu="a100-80gb", execution=execution,
                     workload=Workload(trace="sharegpt", qps=1.0, num_requests=probe_requests))
    configs = [replace(base, policy=p, options={"token_budget": 512} if p == "sarathi" else {})
               for p in ("orca", "vllm", "sarathi")]
    found = search_capacities(CapacityConfig(configs, {"strict": slo}, workers=workers))
    return {c.policy: c.qps for c in found}


def table4_run(policy: str, trace: str, budget: int, seed: int, execution: str = "eager"
               ) -> tuple[float, float]:
    """P50 TTFT and P99 TBT of 128 requests on Yi-34B(-200K), TP2 on A100s, as the artifact ran them
    (hybrid-only's budget is the max model length, whatever `budget`)."""
    options = {} if policy == "sarathi-hybrid-only" else {"token_budget": budget}
    # allreduce "nccl": the paper's 2023 engines had no custom all-reduce (vLLM's came in 2024)
    s = run(RunConfig(policy=policy, model=YI, gpu="a100-80gb", tp=2, options=options, allreduce="nccl",
                      max_model_len=MAX_LEN[trace], execution=execution,
                      workload=Workload(trace=trace, qps=RATES[trace], num_requests=128, seed=seed))).summary
    return s["ttft_p50"], s["tbt_p99"]


def table4_rows(trace: str, budget: int) -> list[str]:
    """One row a system (hybrid-only only with the first budget: it has none of its own): P50 TTFT and P99
    TBT, the medians over SEEDS, beside the paper's, and the P50 TTFT's range over SEEDS."""
    rows = []
    for p, (pt, pb) in TABLE4[trace].items():
        if p == "sarathi-hybrid-only" and budget != BUDGETS[0]:
            continue
        runs = [table4_run(p, trace, budget, seed) for seed in SEEDS]
        ttfts = [r[0] for r in runs]
        ttft, tbt = statistics.median(ttfts), statistics.median(r[1] for r in runs)
        b = MAX_LEN[trace] if p == "sarathi-hybrid-only" else budget
        rows.append(f"| {trace} | {RATES[trace]:g} | {p} | {b} | {ttft:.2f} ({pt}) | {ratio(ttft, pt)} | "
                    f"{min(ttfts):.2f}-{max(ttfts):.2f} | {tbt:.3f} ({pb}) | {ratio(tbt, pb)} |")
    return rows


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
    lines = [("## Table 4: ablation, Yi-34B(-200K) TP2 on A100s, 128 requests, eager, the artifact's "
              "settings"), "", "Medians over five seeds of the arrivals and lengths.", "",
             ("| trace | QPS | system | budget | P50 TTFT s (paper) | ratio | P50 TTFT, seeds 0-4 | "
              "P99 TBT s (paper) | ratio |"),
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for trace in TABLE4:
        for budget in BUDGETS:
            lines += table4_rows(trace, budget)
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
        "**Table 4, P99 TBT of the chunked systems 0.68-0.74x (budget 1024), 0.38-0.45x (512).** A "
        "1024-token iteration of Yi-34B on two A100s costs the roofline ~0.2-0.28 s, the paper ~0.29-0.38 "
        "s: the roofline's efficiencies for that shape, not the scheduling (chunked-only over combined: "
        "1.15-1.18x here, 1.17x and 1.09x in the paper). Hybrid-only's P99 TBT, a whole-prompt iteration "
        "(several prompts, as the artifact's budget of the max model length admits them), is 0.71x "
        "(sharegpt) and 1.66x (arxiv, 2.93 s against 1.76 s: the roofline prices a 10-16K-token prefill "
        "slower than the paper's engine ran it)."
    ),
    (
        "**Table 4, arxiv: hybrid-only's P50 TTFT 0.57x, below the combined system's (the paper: above).**"
        " The policy is now the artifact's (Sarathi's scheduler with a chunk size of the max model length;"
        " it was: one whole prompt per iteration beyond the budget), which moved it from 2.24 s to 2.39 s."
        " Its prefills take less busy time than the combined system's for the same 891K prompt tokens (160"
        " s of prefill iterations against 174 s at budget 1024 and 189 s at 512, seed 0): a whole prompt "
        "in one iteration against 1024-token chunks that each carry the decodes and re-read the prompt's "
        "KV, so at every rate from 0.2 to 0.7 QPS its median P50 TTFT is the lower (1.46 against 1.59 s at"
        " 0.2; 8.15 against 8.41 s at 0.7). The artifact's memory share (0.85: 296,864 KV tokens) leaves "
        "it at 2.39 s (0.8: 2.51 s). The paper's order needs whole prompts to cost more per token than "
        "chunks, the reverse of its own Figure 11; its hybrid P50 TTFT (4.18 s) above its P99 TBT (1.76 s,"
        " one whole-prompt iteration) says its run queued for a reason not in the material."
    ),
    (
        "**Table 4: chunked-only at the artifact's chunk size 512 is past its capacity (2.61x arxiv, 1.47x"
        " sharegpt); at the caption's 1024 it is within 25% (0.85x, 0.80x).** The policy schedules as the "
        "artifact's SimpleChunkingScheduler (tests/test_sarathi_ablations.py). Every 512-token chunk "
        "iteration (0.100 s) hands the next to a decode iteration (43 ms, the weights read again), so the "
        "128 arxiv prompts take 180 s of chunks and ~77 s of decode turns for 256 s of arrivals (load ~1: "
        "backlogged, its P50 TTFT 7.8-51 s over seeds); a 1024-token chunk halves the turns. The paper's "
        "numbers fit the budget of its caption, not the 512 of its script."
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
