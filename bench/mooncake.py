"""Mooncake's conversation trace (12,031 requests, ~12k-token prompts) through vLLM v1's prefix cache: the
hit rate the twin gives against KV size, the trace's own infinite-cache rate (37.3%) and an LRU of its
512-token ids of the same size (a cross-check: one request at a time, whole ids), and the simulation's wall
and CPU time.

Each run is `simctl run --policy vllm-v1 --gpu h100 --model llama-3.1-8b --trace <the trace> --qps 1` with a
tensor-parallel degree (more GPUs, more KV); `--qps 1` time-scales the trace's one hour to about 12,000 s,
which one replica sustains (at its own rate, 3.4 requests/s of 12k-token prompts, one H100 falls behind and
the run gives up). Writes the section "Mooncake" of bench/results/sessions.md (other sections kept).

Usage: PYTHONPATH=. python bench/mooncake.py [--tp 1,2,4,8] [--policies vllm-v1]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from collections import OrderedDict
from pathlib import Path

from simctl.traces.loaders import load_trace_file
from simctl.traces.mooncake import infinite_cache_hit_rate

ROOT = Path(__file__).resolve().parents[1]
TRACE = ROOT / ".." / "shared" / "reference" / "mooncake" / "conversation_trace.jsonl"
RESULTS = ROOT / "bench" / "results" / "sessions.md"
MODEL, GPU, BLOCK = "llama-3.1-8b", "h100", 512


def lru_hit_rate(prompts: list[int], ids: tuple[tuple[int, ...], ...], capacity_tokens: int) -> float:
    """Full-block token hits of an LRU cache of `capacity_tokens` // 512 ids, one request at a time."""
    cache: OrderedDict[int, None] = OrderedDict()
    size, hits = capacity_tokens // BLOCK, 0
    for prompt, row in zip(prompts, ids):
        k = 0
        while k < len(row) and row[k] in cache:
            k += 1
        hits += min(k, prompt // BLOCK) * BLOCK
        for h in row:
            cache[h] = None
            cache.move_to_end(h)
        while len(cache) > size:
            cache.popitem(last=False)
    return hits / sum(prompts)


def simulate(policy: str, tp: int, caching: str) -> tuple[dict, float, float]:
    """The run's summary, its wall seconds and its CPU seconds."""
    cmd = [sys.executable, "-m", "simctl.cli", "run", "--policy", policy, "--gpu", GPU, "--tp", str(tp),
           "--model", MODEL, "--trace", str(TRACE), "--qps", "1", "--json", *caching.split()]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return json.loads(out), wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def write_section(text: str) -> None:
    """Replace (or add) this file's "## Mooncake" section, keeping every other one."""
    old = RESULTS.read_text() if RESULTS.exists() else "# Sessions, closed loops and prefix caching\n"
    start = old.find("\n## Mooncake\n")
    if start >= 0:
        end = old.find("\n## ", start + 1)
        old = old[:start] + (old[end:] if end >= 0 else "\n")
    RESULTS.write_text(old.rstrip("\n") + "\n\n" + text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tp", default="1,2,4,8")
    ap.add_argument("--policies", default="vllm-v1", help="comma list; sarathi and vllm run with caching on")
    args = ap.parse_args()
    trace = load_trace_file(TRACE)
    assert trace.hash_ids is not None
    prompts = trace.prompt_tokens.tolist()
    infinite = infinite_cache_hit_rate(trace.prompt_tokens, trace.hash_ids, BLOCK)
    rows, loads = [], [os.getloadavg()[0]]
    for policy in args.policies.split(","):
        caching = "" if policy == "vllm-v1" else "--enable-prefix-caching 1"
        for tp in map(int, args.tp.split(",")):
            s, wall, cpu = simulate(policy, tp, caching)
            lru = lru_hit_rate(prompts, trace.hash_ids, s["kv_capacity_tokens"])
            rows.append(f"| {policy} | {tp} | {s['kv_capacity_tokens'] / 1e6:.2f} | "
                        f"{100 * s['prefix_cache_hit_rate']:.2f}% | {100 * lru:.2f}% | {s['completed']} | "
                        f"{s['ttft_p50']:.2f} | {wall:.1f} | {cpu:.1f} |")
            loads.append(os.getloadavg()[0])
            print(rows[-1], flush=True)
    write_section(
        "## Mooncake\n\n"
        f"`python bench/mooncake.py`: Mooncake's conversation trace ({len(trace):,} requests, "
        f"{int(trace.prompt_tokens.sum()):,} prompt tokens) on {MODEL}, H100 roofline, `--qps 1` (the "
        "trace's hour time-scaled so that one replica keeps up), vLLM's defaults for an H100 (blocks of 16, "
        "8192 tokens a step). Its infinite-cache token hit rate (ids seen before, full 512-token blocks, one "
        f"request at a time): **{100 * infinite:.2f}%** (the trace's README: 37.3%). The twin's rate is "
        "vLLM's "
        "`prefix_cache_hits / prefix_cache_queries` (fresh requests); the LRU column is a cache of as many "
        "512-token ids as the KV holds, one request at a time, as a cross-check. Wall and CPU: the whole "
        "`simctl run` process (trace reading included), on this machine "
        f"({os.cpu_count()} cores; load average {min(loads):.1f} to {max(loads):.1f} during the runs: where "
        "it exceeds the cores, the wall time is the machine's contention and the CPU time the simulator's "
        "cost).\n\n"
        "| policy | tp | KV (M tokens) | twin hit rate | LRU of ids | completed | TTFT p50 (s) | wall (s) "
        "| CPU (s) |\n|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
