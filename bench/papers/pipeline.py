"""Pipeline parallelism in the seed papers, simulated with `--pp` (issue 38, item 4): SARATHI's pipeline
bubbles on GPT-3 and Sarathi-Serve's Falcon-180B capacity (PP2 x TP4 on 8 A100s), the published numbers
beside the predictions. Writes bench/results/papers/pipeline.md.

    python bench/papers/pipeline.py [--part sarathi|falcon|both] [--probe-requests N] [--workers K]

SARATHI (Agrawal et al., 2023, arXiv 2308.16369; the seeds hold its abstract only): "When used with pipeline
parallelism on GPT-3, SARATHI reduces bubbles by 6.29x, resulting in an end-to-end throughput improvement of
1.91x." GPT-3 (175B) has no public weights; its published shape (Brown et al., 2020, Table 2.1: 96 layers,
d_model 12288, 96 heads of 128, FFN 4 x d_model, 2048 positions, a 50257-token vocabulary) is written as a
Llama-layout config.json whose SwiGLU width 8/3 x d_model = 32768 has the 4 x d_model GELU MLP's parameters
and FLOPs. The deployment, 8 stages of 8-way TP on 64 A100s (a DGX A100 node a stage, the stages joined by
its 8 x 200 Gbit/s InfiniBand), and the offline workload (every request ready at t = 0, prompts of 256-1792
tokens, 128-256 output tokens, 128 to 1024 requests, both systems batching up to 32 requests a virtual engine)
are this study's reading of the paper's pipeline experiment, which the stored seed does not give: an
ASSUMPTION, named in the results. The baseline is Orca's iteration-level batching (whole prompts in a
micro-batch), against SARATHI's decode-maximal batches of chunk 256 and 512.

Sarathi-Serve (Agrawal et al., OSDI 2024; seeds/002): Falcon-180B in TP4-PP2 on two Azure NC96ads v4 VMs (4
A100-80GB each, joined by 100 Gbit/s Ethernet), Table 3's SLOs (P99 TBT 1 s strict, 5 s relaxed; median
scheduling delay 2 s), token budget 512 strict and 2048 relaxed, the sharegpt and arxiv traces (Table 2) with
Poisson arrivals; the abstract's "up to 6.9x" higher capacity than Orca and vLLM (Figure 10's bars are not in
the text). The catalogue's Falcon-180B keeps its published 2048 positions, which the paper's traces (requests
up to 8192 and 16384 tokens) exceed: the study writes its shape (80 layers, d 14848, 232 heads of 64, 8 KV
heads, GELU MLP 4 x d as SwiGLU 39595, a tied 65024 vocabulary) as a config.json with 16384 positions, as the
paper's runs must have served them.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import numpy as np

from simctl.results.output import atomic_write
from simctl.results.slo import SLO, parse_slo
from simctl.sim.run import RunConfig, run
from simctl.studies.capacity import Capacity, CapacityConfig, search_capacities, table3_slos_for
from simctl.traces.workload import Workload

OUT = Path(__file__).resolve().parents[1] / "results" / "papers" / "pipeline.md"

GPT3 = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 12288,
        "num_hidden_layers": 96, "num_attention_heads": 96, "num_key_value_heads": 96,
        "intermediate_size": 32768, "vocab_size": 50257, "max_position_embeddings": 2048,
        "hidden_act": "silu", "tie_word_embeddings": True}
FALCON = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 14848,
          "num_hidden_layers": 80, "num_attention_heads": 232, "num_key_value_heads": 8, "head_dim": 64,
          "intermediate_size": 39595, "vocab_size": 65024, "max_position_embeddings": 16384,
          "hidden_act": "silu", "tie_word_embeddings": True}

SARATHI_BUBBLES, SARATHI_THROUGHPUT = 6.29, 1.91
FALCON_UP_TO = 6.9
# the paper's A100s, their all-reduces NCCL's ring as its 2023 engines ran them (vLLM's custom all-reduce came
# in 2024)
A100 = {"gpu": "a100-80gb", "allreduce": "nccl"}
POLICIES = ("orca", "vllm", "sarathi")
TRACES = ("sharegpt", "arxiv")
SARATHI_MISS = (
    "Where they miss, the cause is the setting: the stored seed holds SARATHI's abstract only, not its "
    "request count, batch size or chunk, and the ratios move with all three (the rows above), so the paper's "
    "numbers pin the setting rather than test the model; the direction, fewer bubbles and more throughput "
    "with chunked decode-maximal batches, holds in every row. The reduction at 1,024 requests fell from "
    "5.49x (2 ms a step) to 4.68x with the roofline's fitted host terms through their 0.118 ms per scheduled "
    "request (3.8 ms a 32-request micro-batch): it adds ~20 s of bubbles to both systems, 4% of Orca's and "
    "24% of SARATHI 256's; the per-layer term alone gives 5.60x (measured at 17a8f34: "
    "research/results/sarathi_pipeline_host.md).")


def write_config(folder: Path, name: str, shape: dict) -> str:
    path = folder / name / "config.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(shape))
    return str(path)


def offline_trace(folder: Path, n: int, seed: int = 0) -> str:
    """n requests ready at t = 0: prompts uniform in 256..1792 tokens, outputs in 128..256 (within GPT-3's
    2048 positions), so that Orca's micro-batches differ by their prompts."""
    rng = np.random.default_rng(seed)
    prompts, outputs = rng.integers(256, 1793, n), rng.integers(128, 257, n)
    path = folder / "offline.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n"
                    + "".join(f"{p},{d},0\n" for p, d in zip(prompts, outputs)))
    return str(path)


BATCH = 32  # requests a virtual engine batches, for both systems: Orca's reservations of 2048 positions fit
SYSTEMS = (("Orca", "orca", {"max_batch_size": BATCH}),
           ("SARATHI 256", "sarathi", {"token_budget": 256, "max_batch_size": BATCH}),
           ("SARATHI 512", "sarathi", {"token_budget": 512, "max_batch_size": BATCH}))
COUNTS = (128, 256, 512, 1024)


def sarathi_part(folder: Path) -> list[str]:
    model = write_config(folder, "gpt-3-175b", GPT3)
    lines = ["## SARATHI: pipeline bubbles on GPT-3 (TP8 x PP8, 64 A100s)", "",
             ("Requests ready at t = 0 (prompts 256-1792, outputs 128-256 tokens), the roofline, 8 virtual "
              "engines; tokens/s counts prompt and output tokens; bubbles: time a stage sat idle while its "
              "next micro-batch was in an earlier stage or crossing a boundary, summed over the 8 stages "
              "(share of the stages' time). SARATHI's chunk 256 and 512 against Orca's whole prompts, both "
              f"batching up to {BATCH} requests a virtual engine."), "",
             ("| requests | system | tokens/s | bubbles (s) | bubble share | bubbles fewer than Orca "
              "(paper 6.29x) | throughput over Orca (paper 1.91x) |"), "|---|---|---|---|---|---|---|"]
    within = []  # (requests, system) whose both ratios are within 25% of the paper's
    for n in COUNTS:
        sub = folder / str(n)
        sub.mkdir()
        trace = offline_trace(sub, n)
        base = None
        for system, policy, options in SYSTEMS:
            config = RunConfig(policy=policy, workload=Workload(trace=trace, qps=None, num_requests=n),
                               model=model, **A100, tp=8, pp=8, pp_link_gbps=1600.0,
                               options=options)
            s = run(config).summary
            tokens, bubbles = s["total_tokens_per_s"], sum(s["pipeline"]["bubble_s"])
            share = s["pipeline"]["bubble_share"]
            if base is None:
                base = (tokens, bubbles)
                vs = "| |"
            else:
                fewer, faster = base[1] / bubbles, tokens / base[0]
                if all(0.75 <= r <= 1.25 for r in (fewer / SARATHI_BUBBLES, faster / SARATHI_THROUGHPUT)):
                    within.append(f"{system} at {n} requests")
                vs = (f"{fewer:.2f}x ({fewer / SARATHI_BUBBLES:.2f}) | "
                      f"{faster:.2f}x ({faster / SARATHI_THROUGHPUT:.2f}) |")
            lines.append(f"| {n} | {system} | {tokens:,.0f} | {bubbles:.1f} | {share:.1%} | {vs}")
    return lines + ["", "In brackets: simctl / paper. Both claims within 25%: "
                    + (", ".join(within) or "none") + ". " + SARATHI_MISS]


def falcon_slos(model: str) -> dict[str, tuple[SLO, int]]:
    """SLO name -> (the SLO, sarathi's token budget): Table 3's published limits, and Table 3's rule (5x and
    25x a decode iteration of 32 requests with 4k contexts) applied to simctl's own decode iteration."""
    rule, decode = table3_slos_for(RunConfig(model=model, **A100, tp=4, pp=2))
    return {"strict 1 s": (parse_slo(["p99_tbt=1"]), 512), "relaxed 5 s": (parse_slo(["p99_tbt=5"]), 2048),
            f"strict {5 * decode:.2f} s (rule)": (rule["strict"], 512),
            f"relaxed {25 * decode:.2f} s (rule)": (rule["relaxed"], 2048)}


def falcon_part(folder: Path, n: int, workers: int | None) -> list[str]:
    model = write_config(folder, "falcon-180b-16k", FALCON)
    slos = falcon_slos(model)
    caps = {}  # each configuration searched under its own SLO, six searches side by side
    for slo_name, (slo, budget) in slos.items():
        configs, names = [], []
        for trace in TRACES:
            for p in POLICIES:
                configs.append(RunConfig(policy=p, workload=Workload(trace=trace, qps=0.5, num_requests=n),
                                         model=model, **A100, tp=4, pp=2, pp_link_gbps=100.0,
                                         options={"token_budget": budget} if p == "sarathi" else {}))
                names.append(f"{trace}|{slo_name}|{p}")
        spec = CapacityConfig(configs, {slo_name: slo}, start_qps=0.5, workers=workers, labels=names)
        caps |= {c.name: c for c in search_capacities(spec)}
    lines = ["## Sarathi-Serve: Falcon-180B capacity (TP4 x PP2, 8 A100s, 100 Gbit/s between the stages)", "",
             (f"Capacity (QPS) by bisection, {n} requests a probe, Poisson arrivals, the roofline; sarathi's "
              "token budget 512 under a strict SLO and 2048 under a relaxed one (the paper's); a median "
              "scheduling delay within 2 s always. Each cell: capacity (what the next rate probed above it "
              "missed; the stages' bubble share at capacity)."), "",
             "| trace | P99 TBT SLO | orca | vllm | sarathi | sarathi / orca | sarathi / vllm |",
             "|---|---|---|---|---|---|---|"]
    best = {True: 0.0, False: 0.0}  # the published limits' rows, the rule's rows
    for trace in TRACES:
        for slo_name in slos:
            cells = [caps[f"{trace}|{slo_name}|{p}"] for p in POLICIES]
            o, v, s = (c.qps for c in cells)
            ratios = [s / o if o else float("inf"), s / v if v else float("inf")]
            published = "rule" not in slo_name
            best[published] = max(best[published], *ratios)
            lines.append(f"| {trace} | {slo_name} | " + " | ".join(_cell(c) for c in cells)
                         + f" | {ratios[0]:.2f}x | {ratios[1]:.2f}x |")
    lines += ["", "| claim | paper | simctl | ratio (simctl / paper) |", "|---|---|---|---|"]
    lines += [(f"| sarathi's capacity over Orca and vLLM, up to ({what}) | {FALCON_UP_TO}x | "
               f"{best[key]:.2f}x | {best[key] / FALCON_UP_TO:.2f} |")
              for key, what in ((True, "Table 3's limits"), (False, "Table 3's rule"))]
    decode = table3_slos_for(RunConfig(model=model, **A100, tp=4, pp=2))[1]
    return lines + ["", (
        f"Table 3's rule gives 5x a decode iteration of 32 requests with 4k contexts; simctl prices that "
        f"iteration at {decode * 1e3:.0f} ms, so the published strict limit of 1 s is {1 / decode:.0f}x it, "
        f"and the paper's own system must have taken about {1e3 / 5:.0f} ms: under the published limits a "
        "baseline's prefill stalls fit the SLO more easily in simctl than in the paper, which narrows the "
        "ratios; the rule's rows keep the paper's relative strictness.")]


def _cell(c: Capacity) -> str:
    at = c.median_search.at_capacity
    bubbles = f", bubbles {at['pipeline']['bubble_share']:.0%}" if at else ""
    return f"{c.qps:.3f} ({', '.join(c.median_search.bound_by) or '-'}{bubbles})"


PARTS = ("sarathi", "falcon")
MARK = "<!-- part: {} -->"


def sections(text: str) -> dict[str, str]:
    """The parts an earlier results file holds, by name (a rerun of one part keeps the other's)."""
    out = {}
    for part in PARTS:
        head = MARK.format(part)
        if head in text:
            rest = text.split(head, 1)[1]
            ends = [rest.index(MARK.format(p)) for p in PARTS if MARK.format(p) in rest]
            out[part] = head + rest[:min(ends)] if ends else head + rest
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", choices=(*PARTS, "both"), default="both")
    ap.add_argument("--probe-requests", type=int, default=1000, help="Falcon-180B: requests a probe [1000]")
    ap.add_argument("--workers", type=int, default=None, help="capacity searches side by side [one a core]")
    args = ap.parse_args()
    found = sections(OUT.read_text()) if OUT.is_file() else {}
    with tempfile.TemporaryDirectory() as tmp:
        for part in PARTS:
            if args.part not in (part, "both"):
                continue
            t0 = time.perf_counter()
            lines = (sarathi_part(Path(tmp)) if part == "sarathi"
                     else falcon_part(Path(tmp), args.probe_requests, args.workers))
            given = "" if part == "sarathi" else f" --probe-requests {args.probe_requests}"
            found[part] = "\n".join([MARK.format(part), *lines, "", (
                f"`python bench/papers/pipeline.py --part {part}{given}`: simulated in "
                f"{time.perf_counter() - t0:.0f} s."), "", ""])
    text = "# Pipeline parallelism in the seed papers\n\n" + "".join(found[p] for p in PARTS if p in found)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(OUT, lambda p: p.write_text(text))
    print(text)


if __name__ == "__main__":
    main()
