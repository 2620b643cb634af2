"""Prepacking (Zhao et al., 2024; seeds/000) reproduced: prefill speed-up of prepacking over Hugging Face's
full batching across the paper's datasets (Section 4.3: 1.6-3.5x), its growth with the batch size (Section
4.5, Figure 6: up to 4.5x for Llama-2-7B and 6x for the 1.3B model) and the larger batches it fits (Section
4.4: up to 16x for the 1.3B model on MMLU), the published numbers beside the predictions. Writes
bench/results/papers/prepacking.md.

    python bench/papers/prepacking.py

The setting as written: one 48 GB A6000; Sheared-LLaMA-1.3B and Llama-2-7B; 1,000 prompts per dataset with
the length statistics of Appendix Table 2 (`simctl.studies.prefill_bench.PROFILES`), batches sampled in
arrival order (no manual batching). Figure 4's batch size and Figure 6's dataset are not in the text: the
study shows batch sizes 8-64 on every dataset and compares the paper's ranges with them. The paper profiled
4- or 8-bit quantized weights; the roofline prices fp16 (the speed-up is a ratio of the same model's
prefills, so the weights' width moves both sides; the memory bound moves with it).

Execution mode: eager, as the paper's baseline and method run on Hugging Face Transformers.
"""

from __future__ import annotations

import time
from functools import cache

from paper_results import TOLERANCE, misses_section, publish, ratio

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.loader import RooflineOptions, load_cost
from simctl.studies.prefill_bench import bench, largest_batch, prompt_lengths

DATASETS = ("mmlu", "samsum", "alpaca", "wikitext512", "hh-rlhf")
BATCHES = (8, 16, 32, 64)
MODELS = {"sheared-llama-1.3b": 6.0, "llama-2-7b": 4.5}  # Figure 6's largest speed-up
ACROSS = (1.6, 3.5)  # Section 4.3's range across datasets and models
LARGER_BATCH_MMLU_1B = 16.0


@cache
def speedups(model: str, seed: int = 0, execution: str = "eager") -> dict[str, dict[int, float]]:
    """Prepack's speed-up (hf-padded's mean prefill time per prompt over prepack's) per dataset and batch."""
    spec, gpu = get_model(model), get_gpu("a6000")
    cost = load_cost(None, spec, gpu, 1, RooflineOptions(execution=execution)).cost
    out: dict[str, dict[int, float]] = {}
    for name in DATASETS:
        pool = prompt_lengths(name, 1000, seed)
        out[name] = {b: bench("hf-padded", pool, b, cost, spec)[0].per_prompt_s
                     / bench("prepack", pool, b, cost, spec)[0].per_prompt_s for b in BATCHES}
    return out


def larger_batch(model: str, name: str = "mmlu", seed: int = 0) -> tuple[int, int]:
    """The largest batch hf-padded and prepack fit in the A6000's memory (prepack: up to the pool)."""
    spec, gpu = get_model(model), get_gpu("a6000")
    pool = prompt_lengths(name, 1000, seed)
    return tuple(largest_batch(p, pool, spec, gpu.memory_bytes) for p in ("hf-padded", "prepack"))


def lengths(name: str) -> str:
    pool = prompt_lengths(name, 1000, 0)
    return f"{min(pool):,}-{max(pool):,} tokens, mean {sum(pool) / len(pool):.0f}"


def misses() -> list[str]:
    """The misses' causes, their numbers computed from the (cached) speed-ups."""
    seven = speedups("llama-2-7b")
    cells = [(v, m, d, b) for m in MODELS for d, row in speedups(m).items() for b, v in row.items()]
    low, high = min(cells), max(cells)
    graphs = speedups(low[1], execution="cuda-graph")[low[2]][low[3]]
    hf, pp = larger_batch("sheared-llama-1.3b")
    top = max(BATCHES)
    return [(
        f"**Llama-2-7B's largest speed-up (Figure 6: up to {MODELS['llama-2-7b']}x) is exceeded at batch "
        f"{top} on MMLU ({seven['mmlu'][top]:.1f}x).** Figure 6's batch sizes and dataset are not in the "
        f"text: at batch 32 the 7B model's MMLU speed-up ({seven['mmlu'][32]:.1f}x) is "
        f"{'within' if abs(seven['mmlu'][32] / MODELS['llama-2-7b'] - 1) <= TOLERANCE else 'outside'} 25% "
        f"of {MODELS['llama-2-7b']}x. A candidate, not measured: the paper's 4/8-bit quantized weights, "
        "whose dequantisation costs both sides alike and so narrows the ratio."
    ), (
        f"**The range across datasets ({ACROSS[0]}-{ACROSS[1]}x) is wider here ({low[0]:.1f}-{high[0]:.1f}x "
        f"over batches {BATCHES[0]}-{top}).** Figure 4's batch size is not in the text; the low end is "
        f"{low[2]} at batch {low[3]} ({low[1]}; lengths {lengths(low[2])}, the narrowest spread, so little "
        f"padding to save: {low[0]:.2f}x, {graphs:.2f}x under CUDA graphs), the high end {high[2]}'s long "
        f"tail ({lengths(high[2])}) at batch {high[3]}."
    ), (
        f"**The larger batch that fits: {pp / max(hf, 1):.1f}x here, up to {LARGER_BATCH_MMLU_1B:g}x in the "
        "paper (1.3B, MMLU).** Prepacking fits the whole 1,000-prompt pool, which caps the ratio; full "
        f"batching fits {hf} prompts under simctl's peak-memory estimate "
        "(`studies.prefill_bench.peak_bytes`), so the paper's Hugging Face baseline must have held more per "
        "padded token than that estimate: not measured here."
    )]


def main() -> None:
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    lines = [f"# Prepacking reproduced ({started}; `python bench/papers/prepacking.py`)", "",
             ("Prefill speed-up of prepack over hf-padded (Full Batching), Hugging Face's eager execution, "
             "one A6000, 1,000 prompts a dataset."), ""]
    lows, highs = [], []
    for model, up_to in MODELS.items():
        s = speedups(model)
        lines += [f"## {model}", "", "| dataset | " + " | ".join(f"B={b}" for b in BATCHES) + " |",
                  "|---|" + "---:|" * len(BATCHES)]
        lines += [f"| {d} | " + " | ".join(f"{s[d][b]:.2f}x" for b in BATCHES) + " |" for d in DATASETS]
        best = max(v for row in s.values() for v in row.values())
        lines += ["", (f"Largest speed-up (Figure 6, up to {up_to}x): {best:.2f}x, "
                      f"ratio {ratio(best, up_to)}."), ""]
        lows.append(min(min(row.values()) for row in s.values()))
        highs.append(max(max(row.values()) for row in s.values()))
    hf, pp = larger_batch("sheared-llama-1.3b")
    lines += ["## Across datasets and the batch that fits", "",
              (f"Speed-up range over datasets, models and batches 8-64: {min(lows):.2f}-{max(highs):.2f}x "
              f"(Section 4.3: {ACROSS[0]}-{ACROSS[1]}x)."), "",
              (f"Largest batch on MMLU, sheared-llama-1.3b (fp16): hf-padded {hf}, prepack {pp} (the pool's "
              f"1,000 caps it): {pp / max(hf, 1):.1f}x (Section 4.4: up to {LARGER_BATCH_MMLU_1B:g}x)."), ""]
    publish("prepacking", lines + misses_section(misses()))


if __name__ == "__main__":
    main()
