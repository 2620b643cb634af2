"""Sarathi-Serve (Agrawal et al., OSDI 2024; seeds/002) reproduced: Figure 9's capacity (Mistral-7B, one
A100-80GB, openchat_sharegpt4, strict SLO; Yi-34B in TP2, both SLOs) and Table 4's ablation (Yi-34B, TP2 on
A100s, 128 requests, token budget 1024), the published numbers beside the predictions. Writes
bench/results/papers/sarathi_serve.md.

    python bench/papers/sarathi_serve.py [--part capacity|yi|table4|both] [--probe-requests N] [--workers K]

The setting as written: Table 3's strict SLO for Mistral-7B (P99 TBT 0.1 s) and the capacity rule of Section 5
(the highest load whose median scheduling delay stays within 2 s: `--capacity-definition paper`), token budget
512 under the strict SLO; Poisson arrivals over the traces of Table 2; Yi-34B in TP2. Table 4's arxiv prompts
reach 16K tokens, past the catalogue's Yi-34B (4K positions): the study serves Yi-34B-200K's shape
(bench/models/yi-34b-200k.json), which the paper's runs must have used. Figure 9 is also searched under
Table 3's rule applied to simctl's own decode iteration (5x it, as the published 0.1 s is 5x the paper's):
the SLO as strict for simctl's engine as the paper's was for its own.

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

from simctl.costs.kv_capacity import KVSizing
from simctl.costs.overheads import HOST_S_PER_REQUEST
from simctl.results.slo import parse_slo
from simctl.sim.run import RunConfig, run
from simctl.studies.capacity import CapacityConfig, search_capacities, table3_slos_for
from simctl.traces.workload import Workload

YI = str(Path(__file__).resolve().parents[1] / "models" / "yi-34b-200k.json")

# Figure 9 (strict SLO, Mistral-7B, sharegpt), as ratios: sarathi / Orca as Section 5.1's text gives it ("up
# to 3.2x higher load compared to Orca (Mistral-7B, openchat_sharegpt4)" under the strict SLO; issue 38 read
# ~2.8 off the bars), sarathi / vLLM as issue 38 reads the bars (the text gives no number)
VS_VLLM, VS_ORCA = 1.8, 3.2
# Figure 9, Yi-34B TP2, sharegpt: Table 3's limits with Section 5.1's token budgets, (P99 TBT s, budget); the
# text's number, sarathi / vLLM under the relaxed SLO, and the abstract's "up to 2.8x" (Yi-34B, over Orca and
# vLLM, either SLO)
YI_SLOS = {"strict": (0.2, 512), "relaxed": (1.0, 2048)}
YI_RELAXED_VS_VLLM, YI_UP_TO = 2.7, 2.8
# Table 4: P50 TTFT and P99 TBT, seconds
TABLE4 = {"sharegpt": {"sarathi-hybrid-only": (0.56, 1.08), "sarathi-chunked-only": (1.04, 0.34),
                       "sarathi": (0.85, 0.29)},
          "arxiv": {"sarathi-hybrid-only": (4.18, 1.76), "sarathi-chunked-only": (4.86, 0.38),
                    "sarathi": (3.03, 0.35)}}
RATES = {"sharegpt": 1.0, "arxiv": 0.5}  # the artifact's scheduling_ablation.sh
MAX_LEN = {"sharegpt": 8192, "arxiv": 16384}
BUDGETS = (512, 1024)  # the artifact's chunk size; the caption's token budget
SEEDS = range(5)


HYBRID = "sarathi-hybrid-only"
Cell = tuple[float, float, list[float]]  # median P50 TTFT, median P99 TBT, the P50 TTFTs over SEEDS


def mistral(execution: str, **fields) -> RunConfig:
    return RunConfig(model="mistral-7b", gpu="a100-80gb", execution=execution, **fields)


def decode_iteration(execution: str) -> float:
    """Table 3's decode iteration (32 requests, 4K context) of Mistral-7B on one A100, seconds."""
    return table3_slos_for(mistral(execution))[1]


def yi(execution: str) -> RunConfig:
    """Yi-34B(-200K) in TP2 on A100s, serving sharegpt's lengths (filtered at 8,192 tokens, as the paper)."""
    # allreduce "nccl": the paper's 2023 engines had no custom all-reduce (vLLM's came in 2024)
    return RunConfig(model=YI, gpu="a100-80gb", tp=2, allreduce="nccl", execution=execution,
                     max_model_len=MAX_LEN["sharegpt"])


def capacities(probe_requests: int, workers: int | None, base: RunConfig, tbt: float, budget: int = 512
               ) -> dict[str, float]:
    """Each system's capacity (QPS) as `base` deploys it, sharegpt, under P99 TBT <= `tbt`, sarathi's token
    budget `budget`."""
    slo = replace(parse_slo([f"p99_tbt={tbt}"]), definition="paper")
    base = replace(base, workload=Workload(trace="sharegpt", qps=1.0, num_requests=probe_requests))
    configs = [replace(base, policy=p, options={"token_budget": budget} if p == "sarathi" else {})
               for p in ("orca", "vllm", "sarathi")]
    found = search_capacities(CapacityConfig(configs, {"strict": slo}, workers=workers))
    return {c.policy: c.qps for c in found}


def table4_config(policy: str, trace: str, budget: int, seed: int, qps: float | None = None,
                  memory: float | None = None) -> RunConfig:
    """128 requests on Yi-34B(-200K), TP2 on A100s, eager, as the artifact ran them (hybrid-only's budget is
    the max model length, whatever `budget`); `qps` and the memory share default to the study's."""
    options = {} if policy == HYBRID else {"token_budget": budget}
    # allreduce "nccl": the paper's 2023 engines had no custom all-reduce (vLLM's came in 2024)
    config = RunConfig(policy=policy, model=YI, gpu="a100-80gb", tp=2, options=options, allreduce="nccl",
                       max_model_len=MAX_LEN[trace], execution="eager",
                       workload=Workload(trace=trace, qps=qps or RATES[trace], num_requests=128, seed=seed))
    return config if memory is None else replace(config, kv_sizing=KVSizing(gpu_memory_utilization=memory))


def median_ttft(policy: str, trace: str, budget: int, **given: float) -> float:
    return statistics.median(run(table4_config(policy, trace, budget, seed, **given)).summary["ttft_p50"]
                             for seed in SEEDS)


def table4_cells() -> dict[tuple[str, str, int], Cell]:
    """(trace, system, budget) -> its Cell; hybrid-only with the first budget only (it has none of its
    own)."""
    cells = {}
    for trace, systems in TABLE4.items():
        for budget in BUDGETS:
            for p in systems:
                if p == HYBRID and budget != BUDGETS[0]:
                    continue
                runs = [run(table4_config(p, trace, budget, seed)).summary for seed in SEEDS]
                ttfts = [s["ttft_p50"] for s in runs]
                cells[(trace, p, budget)] = (statistics.median(ttfts),
                                             statistics.median(s["tbt_p99"] for s in runs), ttfts)
    return cells


def capacity_section(probe_requests: int, workers: int | None
                     ) -> tuple[list[str], dict[tuple[str, str], dict[str, float]]]:
    """The table, and each (execution, limit) row's capacities: Table 3's published 0.1 s, and its rule
    (5 x the decode iteration) applied to simctl's own iteration."""
    lines = ["## Figure 9: capacity, Mistral-7B on one A100, sharegpt, strict SLO", "",
             (f"{probe_requests} requests a probe; capacity rule: median scheduling delay <= 2 s and the SLO "
              "(`--capacity-definition paper`); sarathi's token budget 512. P99 TBT limit: Table 3's 0.1 s "
              "(5 x the paper's decode iteration of 32 requests at 4K context, 20 ms), or its rule: 5 x "
              "simctl's own iteration."), "",
             ("| execution | P99 TBT limit | orca QPS | vllm QPS | sarathi QPS | sarathi / vllm (paper "
              f"{VS_VLLM}) | sarathi / orca (paper {VS_ORCA}) |"), "|---|---|---:|---:|---:|---:|---:|"]
    caps = {}
    for execution in ("eager", "cuda-graph"):
        decode = decode_iteration(execution)
        for limit, tbt in (("published", 0.1), ("rule", 5 * decode)):
            c = caps[(execution, limit)] = capacities(probe_requests, workers, mistral(execution), tbt)
            mode = f"{execution} (the paper's)" if execution == "eager" else execution
            what = "0.1 s" if limit == "published" else f"{tbt:.3f} s (5 x {decode * 1e3:.1f} ms)"
            v, o = c["sarathi"] / c["vllm"], c["sarathi"] / c["orca"]
            lines.append(f"| {mode} | {what} | {c['orca']:.3g} | {c['vllm']:.3g} | {c['sarathi']:.3g} | "
                         f"{v:.2f} (ratio {ratio(v, VS_VLLM)}) | {o:.2f} (ratio {ratio(o, VS_ORCA)}) |")
    return lines, caps


def yi_section(probe_requests: int, workers: int | None
               ) -> tuple[list[str], dict[tuple[str, str], dict[str, float]]]:
    """Figure 9's Yi-34B on sharegpt: each (execution, SLO)'s capacities under Table 3's published limits,
    and the paper's two numbers for it beside the predictions."""
    lines = ["## Figure 9: capacity, Yi-34B(-200K) TP2 on A100s, sharegpt, Table 3's limits", "",
             (f"{probe_requests} requests a probe, the capacity rule as above; sarathi's token budget 512 "
              "under the strict SLO and 2048 under the relaxed one (Section 5.1)."), "",
             ("| execution | SLO (P99 TBT) | orca QPS | vllm QPS | sarathi QPS | sarathi / vllm | "
              "sarathi / orca |"),
             "|---|---|---:|---:|---:|---:|---:|"]
    caps = {}
    for execution in ("eager", "cuda-graph"):
        for name, (tbt, budget) in YI_SLOS.items():
            c = caps[(execution, name)] = capacities(probe_requests, workers, yi(execution), tbt, budget)
            mode = f"{execution} (the paper's)" if execution == "eager" else execution
            lines.append(f"| {mode} | {name} ({tbt:g} s) | {c['orca']:.3g} | {c['vllm']:.3g} | "
                         f"{c['sarathi']:.3g} | {c['sarathi'] / c['vllm']:.2f} | "
                         f"{c['sarathi'] / c['orca']:.2f} |")
    lines += ["", "| claim | paper | " + " | ".join(f"simctl, {e}" for e in ("eager", "cuda-graph")) + " |",
              "|---|---:|---:|---:|"]
    claims = (("sarathi / vLLM, relaxed SLO (Section 5.1's text)", YI_RELAXED_VS_VLLM,
               lambda e: caps[(e, "relaxed")]["sarathi"] / caps[(e, "relaxed")]["vllm"]),
              ("sarathi over Orca and vLLM, up to (the abstract)", YI_UP_TO,
               lambda e: max(caps[(e, n)]["sarathi"] / caps[(e, n)][b]
                             for n in YI_SLOS for b in ("orca", "vllm"))))
    for what, paper, got in claims:
        lines.append(f"| {what} | {paper}x | " + " | ".join(
            f"{got(e):.2f}x ({ratio(got(e), paper)})" for e in ("eager", "cuda-graph")) + " |")
    return lines, caps


def yi_misses(caps: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    """The Yi-34B claims' misses: the relaxed ratio (what binds vLLM there, and the same engine's whole-prompt
    stalls in Table 4 against the paper's), and the strict eager ratio."""
    e, g = caps[("eager", "relaxed")], caps[("cuda-graph", "relaxed")]
    implied = e["sarathi"] / YI_RELAXED_VS_VLLM  # vLLM's capacity were the paper's ratio simctl's
    at = run(replace(yi("eager"), policy="vllm", workload=Workload(trace="sharegpt", qps=implied,
                                                                   num_requests=1000))).summary["tbt_p99"]
    tbt, budget = YI_SLOS["relaxed"]
    hybrid = statistics.median(run(table4_config(HYBRID, "sharegpt", 0, seed)).summary["tbt_p99"]
                               for seed in SEEDS) / TABLE4["sharegpt"][HYBRID][1]
    strict = {x: max(caps[(x, "strict")]["sarathi"] / caps[(x, "strict")][b] for b in ("orca", "vllm"))
              for x in ("eager", "cuda-graph")}
    return [(
        f"**Yi-34B, relaxed SLO: sarathi / vLLM {e['sarathi'] / e['vllm']:.2f} eager, "
        f"{g['sarathi'] / g['vllm']:.2f} with CUDA graphs (the paper: {YI_RELAXED_VS_VLLM}).** vLLM is bound "
        f"by the P99 TBT of its prefill stalls (prompts batched whole, up to the max model length of "
        f"{MAX_LEN['sharegpt']:,} tokens, in one iteration), sarathi at budget {budget} by the scheduling "
        f"delay. At the rate the paper's ratio gives vLLM ({implied:.2f} QPS, eager) simctl's vLLM has a P99 "
        f"TBT of {at:.2f} s, inside the {tbt:g} s limit: the paper's ratio needs its stalls (its P99 gaps) "
        f"about {tbt / at:.2f}x as long as simctl prices them. The same engine's whole-prompt iterations on "
        f"this trace, Table 4's hybrid-only (same model, GPUs and trace), have a P99 TBT {hybrid:.2f}x the "
        "paper's: simctl prices these stalls short, by less than the ratio needs; the rest is not in the "
        "material."
    ), (
        f"**Yi-34B, strict SLO, eager: sarathi up to {strict['eager']:.2f}x a baseline's capacity (the "
        f"abstract: up to {YI_UP_TO}x).** The eager floor, as for Mistral-7B (the first item): with "
        f"CUDA graphs {strict['cuda-graph']:.2f}x (ratio {ratio(strict['cuda-graph'], YI_UP_TO)})."
    )]


def table4_section(cells: dict[tuple[str, str, int], Cell]) -> list[str]:
    lines = [("## Table 4: ablation, Yi-34B(-200K) TP2 on A100s, 128 requests, eager, the artifact's "
              "settings"), "", "Medians over five seeds of the arrivals and lengths.", "",
             ("| trace | QPS | system | budget | P50 TTFT s (paper) | ratio | P50 TTFT, seeds 0-4 | "
              "P99 TBT s (paper) | ratio |"),
             "|---|---:|---|---:|---:|---:|---:|---:|---:|"]
    for (trace, p, budget), (ttft, tbt, ttfts) in cells.items():
        pt, pb = TABLE4[trace][p]
        b = MAX_LEN[trace] if p == HYBRID else budget
        lines.append(f"| {trace} | {RATES[trace]:g} | {p} | {b} | {ttft:.2f} ({pt}) | {ratio(ttft, pt)} | "
                     f"{min(ttfts):.2f}-{max(ttfts):.2f} | {tbt:.3f} ({pb}) | {ratio(tbt, pb)} |")
    return lines


def iteration_times(policy: str, budget: int) -> dict[str, float]:
    """Seed 0 on arxiv: the prefill iterations' count and busy seconds, and the mean decode-only iteration."""
    it = run(table4_config(policy, "arxiv", budget, 0)).iterations
    pre = it["prefill_tokens"] > 0
    return {"prefills": float(it["count"][pre].sum()), "prefill_s": float(it["duration_s"][pre].sum()),
            "decode_s": float(it["duration_s"][~pre].sum() / it["count"][~pre].sum()),
            "prompt_tokens": float(it["prefill_tokens"].sum())}


def capacity_misses(caps: dict[tuple[str, str], dict[str, float]]) -> list[str]:
    eager, graph = decode_iteration("eager"), decode_iteration("cuda-graph")
    yi = table3_slos_for(RunConfig(model=YI, gpu="a100-80gb", tp=2, allreduce="nccl"))[1]
    e, g, rule = caps[("eager", "published")], caps[("cuda-graph", "published")], caps[("cuda-graph", "rule")]
    vs_vllm, vs_orca = rule["sarathi"] / rule["vllm"], rule["sarathi"] / rule["orca"]
    return [(
        "**Capacity, eager: vLLM and Orca fall further than the paper's.** simctl's eager step (a launch "
        "floor of 22 ms for 32 layers, measured on vLLM on an H100, plus the host's terms) makes a Mistral-7B"
        f" decode iteration of 32 requests at 4K context cost {eager * 1e3:.1f} ms, where Table 3's own "
        "strict SLO (0.1 s = 5 x that iteration) says the paper's engine ran it in 20 ms; with CUDA graphs "
        f"the roofline gives {graph * 1e3:.1f} ms (and {yi * 1e3:.1f} ms for Yi-34B TP2 against Table 3's 40 "
        "ms), so the paper's engine hid its launches behind the GPU at that batch and the eager floor "
        "overstates its steps: every decode step of vLLM and Orca grows, the prefill stalls become a larger "
        "share of their gaps, and their P99 TBT reaches 0.1 s at a lower rate (sarathi / vLLM "
        f"{e['sarathi'] / e['vllm']:.2f} eager, {g['sarathi'] / g['vllm']:.2f} with CUDA graphs)."
    ), (
        f"**Capacity, CUDA graphs: sarathi / vLLM {g['sarathi'] / g['vllm']:.2f}, where the paper has about "
        f"{VS_VLLM}.** vLLM is bound by the P99 TBT of its prefill stalls (next item), and the limit, 0.1 s, "
        f"is 5x the paper's 20 ms decode iteration, which costs simctl {graph * 1e3:.1f} ms "
        f"({HOST_S_PER_REQUEST * 32 * 1e3:.1f} ms of it the host's 0.118 ms a scheduled request): the "
        "published limit is stricter for simctl's engine than for the paper's. Under Table 3's rule applied "
        f"to simctl's iteration ({5 * graph:.3f} s) vLLM reaches {rule['vllm']:.3g} QPS and Orca "
        f"{rule['orca']:.3g}, Sarathi stays at {rule['sarathi']:.3g}: sarathi / vLLM {vs_vllm:.2f} (ratio "
        f"{ratio(vs_vllm, VS_VLLM)}) and sarathi / Orca {vs_orca:.2f} (ratio {ratio(vs_orca, VS_ORCA)}). "
        "The setting it takes is the paper's own: a decode iteration of 32 requests at 4K context of 20 ms "
        "on its A100 (an SLO 5x the engine's own step)."
    ), (
        f"**Capacity: vLLM about equals Orca here (vLLM / Orca {g['vllm'] / g['orca']:.2f} with CUDA "
        f"graphs), where the paper has vLLM about {VS_ORCA / VS_VLLM:.2f}x Orca ({VS_ORCA} / {VS_VLLM}).** "
        "Both are bound by the P99 TBT of prefill stalls, about one prompt per prefill iteration in both "
        "(1.01-1.10), so the stalled share of token gaps is prefill over decode iterations per second "
        "whatever the batch. Orca held to 4-6 requests at once would give vLLM / Orca 1.46-2.10 (eager "
        "1.54 at 6), but the artifact runs this experiment's Orca "
        "(osdi-experiments/figure-5-6/mistral7b_strict.yml) at batch 16 with ~40 max-length reservations of "
        "KV, the setting simctl's Orca has: the paper's ratio is not an effect of Orca's memory, and its "
        "cause is not in the material (research/results/sarathi_vllm_orca.md, sarathi_orca_kv.md)."
    )]


def table4_misses(cells: dict[tuple[str, str, int], Cell]) -> list[str]:
    chunked = ("sarathi-chunked-only", "sarathi")

    def tbt(trace: str, p: str, budget: int = BUDGETS[0]) -> float:
        return cells[(trace, p, budget)][1]

    def span(values: list[float]) -> str:
        return f"{min(values):.2f}-{max(values):.2f}"

    ratios = {b: [tbt(t, p, b) / TABLE4[t][p][1] for t in TABLE4 for p in chunked] for b in BUDGETS}
    full = [tbt(t, p, 1024) for t in TABLE4 for p in chunked]
    over = [tbt(t, chunked[0], 1024) / tbt(t, chunked[1], 1024) for t in TABLE4]
    hybrid = [tbt(t, HYBRID) / TABLE4[t][HYBRID][1] for t in TABLE4]
    return [(
        f"**Table 4, P99 TBT of the chunked systems {span(ratios[1024])}x (budget 1024), "
        f"{span(ratios[512])}x (512).** A 1024-token iteration of Yi-34B on two A100s costs the roofline "
        f"~{span(full)} s, the paper ~0.29-0.38 s: the roofline's efficiencies for that shape, not the "
        f"scheduling (chunked-only over combined: {span(over)}x here, 1.17x and 1.09x in the paper). "
        "Hybrid-only's P99 TBT, a whole-prompt iteration (several prompts, as the artifact's budget of the "
        f"max model length admits them), is {hybrid[0]:.2f}x (sharegpt) and {hybrid[1]:.2f}x (arxiv, "
        f"{tbt('arxiv', HYBRID):.2f} s against 1.76 s: the roofline prices a 10-16K-token prefill slower "
        "than the paper's engine ran it)."
    ), hybrid_miss(cells), chunked_miss(cells)]


def hybrid_miss(cells: dict[tuple[str, str, int], Cell]) -> str:
    ttft = cells[("arxiv", HYBRID, BUDGETS[0])][0]
    busy = {b: iteration_times(p, b) for p, b in ((HYBRID, 0), ("sarathi", 1024), ("sarathi", 512))}
    rates = [round(0.2 + 0.1 * k, 1) for k in range(6)]
    sweep = {q: (median_ttft(HYBRID, "arxiv", 0, qps=q), median_ttft("sarathi", "arxiv", 1024, qps=q))
             for q in rates}
    lower = sum(h < c for h, c in sweep.values())
    where = "every rate" if lower == len(rates) else f"{lower} of {len(rates)} rates"
    (low, low_c), (high, high_c) = sweep[rates[0]], sweep[rates[-1]]
    memory = {m: median_ttft(HYBRID, "arxiv", 0, memory=m) for m in (0.85, 0.8)}
    return (
        f"**Table 4, arxiv: hybrid-only's P50 TTFT {ttft / TABLE4['arxiv'][HYBRID][0]:.2f}x, below the "
        "combined system's (the paper: above).** Its prefills take less busy time than the combined "
        f"system's for the same {busy[0]['prompt_tokens'] / 1e3:.0f}K prompt tokens "
        f"({busy[0]['prefill_s']:.0f} s of prefill iterations against {busy[1024]['prefill_s']:.0f} s at "
        f"budget 1024 and {busy[512]['prefill_s']:.0f} s at 512, seed 0): a whole prompt in one iteration "
        "against chunks that each carry the decodes and re-read the prompt's KV, so at "
        f"{where} from {rates[0]} to {rates[-1]} QPS its median P50 TTFT is the lower (against the combined "
        f"system at 1024: {low:.2f} against {low_c:.2f} s at {rates[0]}; {high:.2f} against {high_c:.2f} s at"
        f" {rates[-1]}). The artifact's memory share (0.85) leaves it at {memory[0.85]:.2f} s (0.8: "
        f"{memory[0.8]:.2f} s). The paper's order needs whole prompts to cost more per token than chunks, "
        "the reverse of its own Figure 11; its hybrid P50 TTFT (4.18 s) above its P99 TBT (1.76 s, one "
        "whole-prompt iteration) says its run queued for a reason not in the material."
    )


def chunked_miss(cells: dict[tuple[str, str, int], Cell]) -> str:
    def r(trace: str, budget: int) -> str:
        chunked = "sarathi-chunked-only"
        return f"{cells[(trace, chunked, budget)][0] / TABLE4[trace][chunked][0]:.2f}x"

    t = iteration_times("sarathi-chunked-only", 512)
    ttfts = cells[("arxiv", "sarathi-chunked-only", 512)][2]
    return (
        f"**Table 4: chunked-only at the artifact's chunk size 512 is past its capacity ({r('arxiv', 512)} "
        f"arxiv, {r('sharegpt', 512)} sharegpt); at the caption's 1024, {r('arxiv', 1024)} and "
        f"{r('sharegpt', 1024)}.** The policy schedules as the artifact's SimpleChunkingScheduler "
        "(tests/test_sarathi_ablations.py). Every 512-token chunk iteration "
        f"({t['prefill_s'] / t['prefills']:.3f} s) hands the next to a decode iteration "
        f"({t['decode_s'] * 1e3:.0f} ms, the weights read again), so the 128 arxiv prompts take "
        f"{t['prefill_s']:.0f} s of chunks and ~{t['prefills'] * t['decode_s']:.0f} s of decode turns for "
        f"{128 / RATES['arxiv']:.0f} s of arrivals (backlogged: its P50 TTFT "
        f"{min(ttfts):.1f}-{max(ttfts):.0f} s over seeds); a 1024-token chunk halves the turns. The paper's "
        "numbers fit the budget of its caption, not the 512 of its script."
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--part", choices=("capacity", "yi", "table4", "both"), default="both")
    ap.add_argument("--probe-requests", type=int, default=1000)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Sarathi-Serve reproduced ({started}; `python bench/papers/sarathi_serve.py`)", ""]
    misses = []
    if args.part in ("capacity", "both"):
        table, caps = capacity_section(args.probe_requests, args.workers)
        lines += table + [""]
        misses += capacity_misses(caps)
    if args.part in ("yi", "both"):
        table, yi_caps = yi_section(args.probe_requests, args.workers)
        lines += table + [""]
        misses += yi_misses(yi_caps)
    if args.part in ("table4", "both"):
        cells = table4_cells()
        lines += table4_section(cells) + [""]
        misses += table4_misses(cells)
    if args.part == "both":
        publish("sarathi_serve", lines + misses_section(misses))
    else:  # a part alone is printed only
        print("\n".join(lines + misses_section(misses)))


if __name__ == "__main__":
    main()
