"""SARATHI (Agrawal et al., 2023, arXiv 2308.16369v1; the seeds hold its abstract, the full text is public) on
one GPU, reproduced: its Table 2 (one iteration of LLaMA-13B on an A6000 in each batching scheme) and its
Table 4 (the peak decode speed-up and end-to-end throughput gain of decode-maximal batching, LLaMA-13B on an
A6000 and LLaMA-33B on an A100, chunk 256), the published numbers beside the predictions. Writes
bench/results/papers/sarathi.md. (Its pipeline experiment on GPT-3: bench/papers/pipeline.py.)

    python bench/papers/sarathi.py [--requests N]

The setting as Section 5.1 writes it: each request P + D tokens (the table's sequence length) at the table's
P:D ratio, the table's batch size B; the baseline runs prefill-only and decode-only batches (a batch's prompts
prefilled together, then decoded until they finish: simctl's `faster-transformer`); SARATHI runs
decode-maximal batches, one prefill chunk beside up to B - 1 decodes, the chunk 256 less the decodes so that
the batch is a multiple of the 128-token tile (Section 4.4: 256 - (B - 1)): `sarathi` with a token budget of
256 and `max_prefills` 1. Every request is ready at t = 0 and the throughput is tokens over the time to finish
them. The decode speed-up is Section 5.1.1's: the baseline's decode iteration of B requests over B, against
the marginal time of SARATHI's B - 1 decodes (its decode-maximal batch less a prefill-only batch of the same
chunk) over B - 1; priced here for decodes at the prompt's length and a chunk from the middle of the prompt.
LLaMA-13B is llama-2-13b's shape (the same 40 layers of 5120); LLaMA-33B's (60 layers of 6656, 52 heads, FFN
17920) is written as a config.json with 4096 positions, as the paper set its own layers and sizes in nanoGPT
for 3K sequences. The paper's engine is nanoGPT in eager PyTorch: simctl's eager mode (CUDA graphs price
these steps the same: each is longer than the eager launch floor). Table 2's prefill-only row is one prompt
of 1,024 tokens: its per-token time, 0.229 ms, is its 234.8 ms over 1,024 (the caption's batch of 4 would be
4,096 tokens, 0.69 s at the A6000's peak).
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from paper_results import misses_section, publish, ratio

from simctl.catalogue.models import get_model
from simctl.costs.roofline import Roofline
from simctl.policies.plan import BatchPlan, hybrid
from simctl.policies.seq import Seq
from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload

LLAMA_33B = {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": 6656,
             "num_hidden_layers": 60, "num_attention_heads": 52, "num_key_value_heads": 52,
             "intermediate_size": 17920, "vocab_size": 32000, "max_position_embeddings": 4096,
             "hidden_act": "silu"}
# Table 2 (LLaMA-13B, A6000), ms: a prefill of 1,024 tokens; a decode-only batch of 4 at 1,024; a
# decode-maximal batch of one 1,021-token prefill and 3 decodes
TABLE2 = {"prefill-only": 234.8, "decode-only": 49.96, "decode-maximal": 238.4}
# Table 4: model, GPU, sequence length, batch, P:D, decode speed-up, throughput gain
TABLE4 = [("llama-2-13b", "a6000", 1024, 6, 50, 5.45, 1.33),
          ("llama-2-13b", "a6000", 2048, 6, 50, 3.26, 1.26),
          ("llama-2-13b", "a6000", 3072, 6, 50, 2.51, 1.22),
          ("llama-33b", "a100-80gb", 1024, 10, 28, 3.83, 1.25),
          ("llama-33b", "a100-80gb", 2048, 5, 63, 4.25, 1.22),
          ("llama-33b", "a100-80gb", 3072, 3, 127, 3.51, 1.14)]
# Figure 8 (LLaMA-13B, A6000, chunk 256): decode speed-ups of 2.8x to 10x over batch sizes up to the largest
# that fits each sequence length (Section 5.2: 18, 10 and 6 for 1K, 2K and 3K)
FIGURE8_RANGE, FIGURE8_BATCHES = (2.8, 10.0), {1024: 18, 2048: 10, 3072: 6}
CHUNK, TILE_ALIGNED = 256, 256  # the chunk, and the batch's tokens it is aligned to (256 - (B - 1) + B - 1)
EXECUTION = "eager"


def seqs_at(context: int, n: int, start: int = 0) -> list[Seq]:
    """n requests with `context` tokens computed, each past its prefill (decodes) unless `start` is given."""
    out = [Seq(start + i, 0.0, context, 2) for i in range(n)]
    for s in out:
        s.computed, s.generated = context, 1
    return out


def prompt(length: int, done: int, i: int = 100) -> Seq:
    s = Seq(i, 0.0, length, 2)
    s.computed = done
    return s


def table2_plans() -> dict[str, BatchPlan]:
    return {"prefill-only": hybrid([], [prompt(1024, 0)], [1024]),
            "decode-only": hybrid(seqs_at(1024, 4), [], []),
            "decode-maximal": hybrid(seqs_at(1024, 3), [prompt(1021, 0)], [1021])}


def decode_times(cost: Roofline, p: int, b: int) -> tuple[float, float]:
    """Section 5.1.1's decode times per token, seconds: the baseline's decode iteration of b over b, and
    SARATHI's marginal one (its decode-maximal batch less the prefill-only batch of its chunk, over b - 1)."""
    baseline = cost.iteration_time(hybrid(seqs_at(p, b), [], [])) / b
    chunk = TILE_ALIGNED - (b - 1)
    with_decodes = cost.iteration_time(hybrid(seqs_at(p, b - 1), [prompt(p, p // 2)], [chunk]))
    alone = cost.iteration_time(hybrid([], [prompt(p, p // 2)], [chunk]))
    return baseline, (with_decodes - alone) / (b - 1)


def trace(folder: Path, p: int, d: int, n: int) -> str:
    path = folder / f"offline_{p}_{d}.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n" + f"{p},{d},0\n" * n)
    return str(path)


def throughput_gain(model: str, gpu: str, p: int, d: int, b: int, n: int, folder: Path) -> float:
    """The time to finish n requests of p + d tokens, the baseline's over SARATHI's."""
    base = RunConfig(model=model, gpu=gpu, execution=EXECUTION,
                     workload=Workload(trace=trace(folder, p, d, n), qps=None, num_requests=n))
    times = [run(replace(base, policy=policy, options=options)).summary["makespan_s"]
             for policy, options in (("faster-transformer", {"max_batch_size": b}),
                                     ("sarathi", {"token_budget": TILE_ALIGNED, "max_prefills": 1,
                                                  "max_batch_size": b}))]
    return times[0] / times[1]


def study(n: int) -> list[str]:
    cost = Roofline("llama-2-13b", "a6000", execution=EXECUTION)
    plans = table2_plans()
    lines = ["## Table 2: one iteration of LLaMA-13B on an A6000, ms", "",
             "| batch | paper | simctl | ratio |", "|---|---:|---:|---:|"]
    for name, paper in TABLE2.items():
        got = cost.iteration_time(plans[name]) * 1e3
        lines.append(f"| {name} | {paper} | {got:.1f} | {ratio(got, paper)} |")
    speedups = [base / marginal for length, most in FIGURE8_BATCHES.items() for b in range(2, most + 1)
                for base, marginal in [decode_times(cost, length - round(length / 51), b)]]
    lo, hi = min(speedups), max(speedups)
    lines += ["", "## Figure 8: decode speed-up, LLaMA-13B on an A6000, chunk 256", "",
              (f"Over batch sizes 2 to the largest that fits (18, 10, 6 at 1K, 2K, 3K tokens; P:D 50): "
               f"{lo:.2f}x to {hi:.2f}x (paper {FIGURE8_RANGE[0]}x to {FIGURE8_RANGE[1]}x: "
               f"{ratio(lo, FIGURE8_RANGE[0])} and {ratio(hi, FIGURE8_RANGE[1])})."),
              "", "## Table 4: peak gains, chunk 256", "",
              (f"{n} requests ready at t = 0 a row, each of the row's sequence length split at its P:D "
               "ratio. Decode speed-up per Section 5.1.1 (the cost model's iterations: the baseline's and "
               "SARATHI's marginal decode time per token); throughput gain: the baseline's time to finish "
               "them over SARATHI's."), "",
              ("| model | GPU | length | batch | P:D | decode ms/token, baseline / SARATHI | decode "
               "speed-up (paper) | ratio | throughput gain (paper) | ratio |"),
              "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    misses = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        (folder / "llama-33b").mkdir()
        (folder / "llama-33b" / "config.json").write_text(json.dumps(LLAMA_33B))
        for model, gpu, length, b, pd, paper_speedup, paper_gain in TABLE4:
            path = str(folder / "llama-33b" / "config.json") if model == "llama-33b" else model
            d = round(length / (pd + 1))
            p = length - d
            base, marginal = decode_times(Roofline(get_model(path), gpu, execution=EXECUTION), p, b)
            speedup, gain = base / marginal, throughput_gain(path, gpu, p, d, b, n, folder)
            lines.append(f"| {model} | {gpu} | {length} | {b} | {pd}:1 | {base * 1e3:.2f} / "
                         f"{marginal * 1e3:.2f} | {speedup:.2f}x ({paper_speedup}x) | "
                         f"{ratio(speedup, paper_speedup)} | {gain:.2f}x ({paper_gain}x) | "
                         f"{ratio(gain, paper_gain)} |")
            if "miss" in ratio(speedup, paper_speedup):
                misses.append(
                    f"**Decode speed-up, {model} at {length} tokens, batch {b}: {speedup:.2f}x (paper "
                    f"{paper_speedup}x).** SARATHI's {b - 1} piggybacked decodes cost simctl "
                    f"{marginal * 1e3:.2f} ms a token, about their attention over {p:,} tokens of KV (the "
                    "chunk's linears take their rows almost free); with the baseline's decode as simctl "
                    f"prices it ({base * 1e3:.2f} ms a token), the paper's speed-up needs "
                    f"{base / paper_speedup * 1e3:.2f} ms: its piggybacked decodes cost it more than their "
                    "KV read at the roofline's share of the bandwidth; its kernels' times are not in the "
                    "material.")
    return lines + [""] + misses_section(misses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=120, help="requests a Table 4 row [120]")
    args = ap.parse_args()
    t0 = time.perf_counter()
    lines = study(args.requests)
    command = f"python bench/papers/sarathi.py --requests {args.requests}"
    head = [f"# SARATHI on one GPU reproduced (`{command}`)", ""]
    publish("sarathi", head + lines + [f"Simulated in {time.perf_counter() - t0:.0f} s."])


if __name__ == "__main__":
    main()
