"""Baton (Cong et al., 2024; seeds/004) reproduced: Tables 1-2, the time to complete a whole query set (every
query there at t = 0) per batch size for its Benchmark (Hugging Face full batching with early return:
`hf-padded`), PD, Baton and Baton-PD, the published numbers beside the predictions. Writes
bench/results/papers/baton.md.

    python bench/papers/baton.py

The setting as written: Llama-2-7B-chat in fp16, greedy decoding (identical output lengths for every
method); Table 1 on an A6000 (120 mixed queries, batch 4 and 8), Table 2 on an RTX 4090 (30 short queries,
batch 2-10); asynchronous P&D decoupling for Baton-PD (`--overlap 1`). The query sets are
`simctl.studies.query_set`'s (the paper's word ranges at Llama-2's 1.5 tokens a word); Table 1's batch-4 row
doubles every sequence, as the paper's did.

Execution mode: eager, as every method ran on Hugging Face Transformers (PyTorch launching each kernel from
Python). Hugging Face's step costs more host time than vLLM's: the study fits that one number, the host time
per step (beside the roofline's 0.118 ms per scheduled request), on one published cell (the Benchmark's
batch-2 time in Table 2) and predicts every other cell with it; 2 ms a step (the roofline's default before
simctl issue 39) is shown beside it.
"""

from __future__ import annotations

import time
from functools import cache

from paper_results import misses_section, publish, ratio

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.kv_capacity import kv_capacity_tokens
from simctl.costs.loader import RooflineOptions, load_cost
from simctl.studies.query_set import LONG, completion_time, query_set
from simctl.traces.request import Request

POLICIES = ("hf-padded", "pd", "baton", "baton-pd")
# completion times, s: Table 1 (A6000, mixed) and Table 2 (RTX 4090, short; Benchmark and Baton only)
TABLE1 = {4: {"hf-padded": 21901, "pd": 21781, "baton": 20549, "baton-pd": 11771},
          8: {"hf-padded": 6619, "pd": 6577, "baton": 3424, "baton-pd": 2654}}
TABLE2 = {2: {"hf-padded": 161.77, "baton": 83.43}, 4: {"hf-padded": 92.68, "baton": 49.61},
          6: {"hf-padded": 61.70, "baton": 37.25}, 8: {"hf-padded": 50.07, "baton": 31.08},
          10: {"hf-padded": 40.45, "baton": 30.99}}
SETS = {"mixed": ("a6000", TABLE1), "short": ("rtx-4090", TABLE2)}
DOUBLED = {("mixed", 4)}  # "all query sequence were duplicated in the experiment with batch size of 4"


@cache
def completions(name: str, batch: int, step_overhead_ms: float, seed: int = 0, by_kind: bool = False
                ) -> dict[str, float]:
    """Each method's completion time (s) of set `name` at `batch`, eager, with that host time per step; the
    set drawn with `seed`, shuffled or (`by_kind`) in the order the paper lists its kinds."""
    gpu, _ = SETS[name]
    spec, g = get_model("llama-2-7b"), get_gpu(gpu)
    eager = RooflineOptions(execution="eager", overhead_s=step_overhead_ms / 1e3)
    cost = load_cost(None, spec, g, 1, eager).cost
    kv = kv_capacity_tokens(spec, g)
    requests = query_set(name, seed, 2.0 if (name, batch) in DOUBLED else 1.0)
    if by_kind:  # long inputs, then long outputs, then short-short
        kind = sorted(requests, key=lambda r: (r.prompt_tokens < LONG[0], r.output_tokens < LONG[0]))
        requests = [Request(i, 0.0, r.prompt_tokens, r.output_tokens) for i, r in enumerate(kind)]
    return {p: completion_time(p, requests, batch, cost, kv, {"overlap": 1} if p == "baton-pd" else {}
                               )["completion_s"] for p in POLICIES}


def fitted_step_overhead_ms() -> float:
    """The host time per step at which the Benchmark completes the short set at batch 2 in the paper's
    161.77 s: completion time grows by one iteration count per ms, so two runs give it exactly."""
    a, b = (completions("short", 2, ms)["hf-padded"] for ms in (2.0, 12.0))
    return 2.0 + (TABLE2[2]["hf-padded"] - a) / ((b - a) / 10.0)


def _cell(pred: float, paper: float | None) -> str:
    if paper is None:
        return f"{pred:.2f}x"
    return f"{pred:.2f}x ({paper:.2f}x; {ratio(pred, paper)})"


def section(name: str, overheads: list[float]) -> list[str]:
    gpu, table = SETS[name]
    lines = [f"## {'Table 1' if name == 'mixed' else 'Table 2'}: {name} set, Llama-2-7B on {gpu}, eager", "",
             "Speed-up over the Benchmark (hf-padded), predicted (published; ratio).", "",
             "| batch | host ms/step | Benchmark s (paper) | pd | baton | baton-pd |",
             "|---:|---:|---:|---|---|---|"]
    for batch, paper in table.items():
        for ms in overheads:
            t = completions(name, batch, ms)
            base = t["hf-padded"]
            cells = [_cell(base / t[p], paper["hf-padded"] / paper[p] if p in paper else None)
                     for p in POLICIES[1:]]
            lines.append(f"| {batch} | {ms:.1f} | {base:.1f} ({paper['hf-padded']}) | "
                         + " | ".join(cells) + " |")
    return lines


def order_section(ms: float) -> list[str]:
    """Table 1's speed-ups against the set's order, which the paper does not give: shuffled with five seeds
    (the study's seed 0 among them) and in the order it lists the kinds."""
    lines = ["## Table 1 against the set's order (not given in the paper)", "",
             f"Host time {ms:.1f} ms a step; Benchmark s, and Baton-PD's speed-up over it.", "",
             "| batch | order | Benchmark s (paper) | baton-pd (paper) |", "|---:|---|---:|---|"]
    for batch, paper in TABLE1.items():
        for tag, t in [(f"shuffled, seed {k}", completions("mixed", batch, ms, k)) for k in range(5)] + [
                ("by kind", completions("mixed", batch, ms, by_kind=True))]:
            lines.append(f"| {batch} | {tag} | {t['hf-padded']:.0f} ({paper['hf-padded']}) | "
                         f"{_cell(t['hf-padded'] / t['baton-pd'], paper['hf-padded'] / paper['baton-pd'])} |")
    return lines


def misses(fitted: float) -> list[str]:
    """The misses' causes, their numbers computed (completions are cached)."""
    at2 = [completions("short", b, 2.0)["hf-padded"] / paper["hf-padded"] for b, paper in TABLE2.items()]
    fit = [completions("short", b, fitted)["hf-padded"] / paper["hf-padded"] for b, paper in TABLE2.items()]
    b10 = completions("short", 10, fitted)
    b2 = completions("short", 2, fitted)
    return [(
        f"**Absolute times at 2 ms a step (the roofline's default before issue 39): {min(at2):.2f}-"
        f"{max(at2):.2f}x the paper's (Table 2).** Hugging Face's generate loop spends ~{fitted:.0f} ms of "
        "host time a step on Llama-2-7B (fitted on one cell); with it, every Benchmark time of Table 2 comes "
        f"within {max(abs(r - 1) for r in fit):.0%} (batch 2 is the fitted cell) and plain Baton "
        f"{'beats' if b10['baton'] < b10['hf-padded'] else 'loses to'} the Benchmark at batch 10 "
        f"({b10['hf-padded'] / b10['baton']:.2f}x; the paper's wins)."
    ), (
        f"**Table 2, Baton at batch 2: {b2['hf-padded'] / b2['baton']:.2f}x against 1.94x.** Both methods "
        "decode about the same tokens; at batch 2 the Benchmark's extra steps are its batches' wait for the "
        "longer of two outputs, E[max of 2] / E[mean] = 1.24 for outputs uniform over 48-300 tokens, which "
        "bounds any step-count gain near 1.3x: the paper's 1.94x needs the Benchmark's steps to cost more "
        "than Baton's (Hugging Face's padded KV growing with the batch's longest row), which the roofline "
        "prices alike."
    ), table1_miss(fitted), baton4_miss(fitted)]


def table1_miss(fitted: float) -> str:
    t = {b: completions("mixed", b, fitted) for b in TABLE1}

    def published(b: int, p: str) -> float:
        return TABLE1[b]["hf-padded"] / TABLE1[b][p]

    pd = {b: t[b]["hf-padded"] / t[b]["baton-pd"] / published(b, "baton-pd") for b in TABLE1}
    shuffled = [(r := completions("mixed", 8, fitted, k))["hf-padded"] / r["baton-pd"] for k in range(5)]
    kind = completions("mixed", 8, fitted, by_kind=True)
    return (
        f"**Table 1, Baton-PD's speed-up {pd[4]:.2f}x (batch 4) and {pd[8]:.2f}x (batch 8) the paper's.** "
        f"Its own times come within 25% ({t[4]['baton-pd']:,.0f} s against {TABLE1[4]['baton-pd']:,} at "
        f"batch 4; {t[8]['baton-pd']:,.0f} s against {TABLE1[8]['baton-pd']:,} at batch 8), and so does the "
        f"Benchmark's at batch 4 ({t[4]['hf-padded'] / TABLE1[4]['hf-padded']:.2f}x): the miss is the "
        f"Benchmark at batch 8, {t[8]['hf-padded'] / TABLE1[8]['hf-padded']:.2f}x the paper's time. The "
        "Benchmark's time is its batches' wait for their longest output, set by the order of the set, which "
        f"the paper does not give: shuffled (five seeds), Baton-PD's speed-up is {min(shuffled):.2f}-"
        f"{max(shuffled):.2f}x at batch 8; in the order the paper lists the kinds (long outputs batched "
        f"together) {kind['hf-padded'] / kind['baton-pd']:.2f}x; the paper's 2.49x needs an order between the"
        " two."
    )


def baton4_miss(fitted: float) -> str:
    """Plain Baton at batch 4, split into its cost over Baton-PD and the Benchmark's over Baton-PD (the
    steps behind it: research/baton_batch4.py)."""
    t = {b: completions("mixed", b, fitted) for b in TABLE1}
    own = {b: t[b]["baton"] / t[b]["baton-pd"] for b in TABLE1}
    paper_own = {b: TABLE1[b]["baton"] / TABLE1[b]["baton-pd"] for b in TABLE1}
    bench = {b: t[b]["hf-padded"] / t[b]["baton-pd"] for b in TABLE1}
    paper_bench = {b: TABLE1[b]["hf-padded"] / TABLE1[b]["baton-pd"] for b in TABLE1}
    seeds = [(r := completions("mixed", 4, fitted, k))["baton"] / r["baton-pd"] for k in range(5)]
    kind = completions("mixed", 4, fitted, by_kind=True)
    by_kind = kind["hf-padded"] / kind["baton"], kind["hf-padded"] / kind["baton-pd"]
    return (
        f"**Table 1, plain Baton at batch 4: {bench[4] / own[4]:.2f}x against "
        f"{paper_bench[4] / paper_own[4]:.2f}x.** Its own cost over Baton-PD reproduces, {own[4]:.2f}x "
        f"Baton-PD's time ({min(seeds):.2f}-{max(seeds):.2f} over five shuffled orders) against the paper's "
        f"{paper_own[4]:.2f}x, and it is not its insertions (80 steps, 1% of its time; running rows are "
        "padded to the new prompt as the paper's Section 4.2 says, never re-prefilled) but its padded KV: "
        "each insertion widens every row by the doubled prompt (11-13k tokens), so 2.5 rows a step fit the "
        "A6000 against Baton-PD's 3.8 (research/baton_batch4.py); the miss is Baton-PD's, the Benchmark at "
        f"{bench[4]:.2f}x Baton-PD's time against {paper_bench[4]:.2f}x "
        f"({bench[4] / own[4] / (paper_bench[4] / paper_own[4]):.2f} = {bench[4] / paper_bench[4]:.2f} x "
        f"{paper_own[4] / own[4]:.2f}), and no order gives both (by kind: Baton {by_kind[0]:.2f}x, Baton-PD "
        f"{by_kind[1]:.2f}x). Batch 8's match is two misses cancelling: Baton {own[8]:.2f}x Baton-PD's time "
        f"against {paper_own[8]:.2f}x (3.6 rows of 8 fit), the Benchmark {bench[8]:.2f}x against "
        f"{paper_bench[8]:.2f}x."
    )


def main() -> None:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    fitted = fitted_step_overhead_ms()
    lines = [f"# Baton reproduced ({started}; `python bench/papers/baton.py`)", "",
             (f"Host time per step fitted on Table 2's Benchmark at batch 2: {fitted:.1f} ms (beside 2 ms, "
             "the roofline's default before issue 39)."), ""]
    for name in SETS:
        lines += section(name, [2.0, fitted]) + [""]
    lines += order_section(fitted) + [""]
    publish("baton", lines + misses_section(misses(fitted)))


if __name__ == "__main__":
    main()
