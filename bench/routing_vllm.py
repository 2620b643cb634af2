"""Routed prefix caches against real vLLM (issue 40 item 4, `simctl.validation.routed_hits`): the twin routes
a trace across replicas (vllm-v1 each, configured as the real engine), then the real vLLM serves each
replica's share in turn at concurrency 1, its prefix cache reset between shares. Per replica: vLLM's cached
tokens against the twin's serving the share in vLLM's order (request by request), the routed replica's hit
total, and whether the routed replica's final cached blocks are the serial twin's.

Two traces. Sessions (bench/sessions_vllm.py's: sessions of --turns turns sharing a system prompt, arriving
Poisson at --qps sessions per second, each later turn resending its context) behind the `session` router: a
share must hold a session's every turn, since vLLM resends the ids it generated for the turn before, and the
routers that do not stick to a session split them. Prefix groups (--groups system prompts of --system
tokens, each request one of them plus 20-200 tokens of its own, 20-120 outputs, Poisson at --qps) behind
`prefix` and `kv-cost`.

    PYTHONPATH=. .venv/bin/python bench/routing_vllm.py --kv-blocks 24 400 --out bench/results/routing.md
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from sessions_vllm import markdown_section, session_requests, write_section

from simctl.engine.vllm_real import CPU_BLOCK_SIZE, VLLMServer, vllm_args_for
from simctl.traces.request import Request
from simctl.validation.routed_hits import as_row, check_routed

SECTION = "## Routed caches on real vLLM"
ABOUT = ("The twin routes the trace across the replicas (each a vllm-v1 configured as the engine, on the "
         "tiny model's CPU roofline: the times only order events); the real vLLM (CPU, tiny, blocks of 128)"
         " then serves each replica's share alone, one request at a time, its prefix cache reset first. "
         "vLLM cached: its num_cached_tokens summed over the share; twin, serial: the twin serving the "
         "share in vLLM's order (`validation.prefix_hits.serial_hits`); twin, routed: the routed replica's "
         "hits as the cluster served its requests (several in flight); equal: requests whose cached tokens "
         "vLLM and the serial twin agree on; same blocks: whether the routed replica ends caching exactly "
         "the blocks the serial twin does (vLLM's own blocks are not visible from outside).")
COLUMNS = ("trace", "router", "KV blocks", "replica", "requests", "vLLM cached", "twin, serial",
           "twin, routed", "equal", "cached blocks at the end", "same blocks")


def grouped(n: int, groups: int, system: int, qps: float, seed: int) -> list[Request]:
    """`n` requests, each of one of `groups` shared system prompts (uniformly) plus 20-200 tokens of its own,
    20-120 outputs, Poisson at `qps`."""
    rng = np.random.default_rng(seed)
    at = np.cumsum(rng.exponential(1 / qps, n))
    return [Request(i, float(at[i]), system + int(rng.integers(20, 201)), int(rng.integers(20, 121)),
                    prefix_group=int(rng.integers(groups)), prefix_tokens=system) for i in range(n)]


def cases(args: argparse.Namespace) -> dict[str, tuple[Callable[[], list[Request]], list[str]]]:
    """trace -> (its requests, the routers it is routed by)."""
    a = args
    return {"sessions": (lambda: session_requests(a.sessions, a.turns, a.system, a.qps, a.seed), ["session"]),
            "groups": (lambda: grouped(args.sessions * args.turns, args.groups, args.system, args.qps,
                                       args.seed), ["prefix", "kv-cost"])}


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for blocks in args.kv_blocks:
        deployment = vllm_args_for("tiny", args.seed, {"block_size": CPU_BLOCK_SIZE},
                                    kv_capacity=blocks * CPU_BLOCK_SIZE)
        with VLLMServer("tiny", deployment) as server:
            for trace, (make, routers) in cases(args).items():
                for router in routers:
                    t0 = time.perf_counter()
                    for check in check_routed(make(), server, router, args.replicas, args.seed):
                        rows.append({"trace": trace, "router": router, "kv_blocks": blocks, **as_row(check),
                                     "wall_s": time.perf_counter() - t0})
                        print(rows[-1], flush=True)
    return rows


def table(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    command = (f"`PYTHONPATH=. .venv/bin/python bench/routing_vllm.py --sessions {args.sessions} --turns "
               f"{args.turns} --groups {args.groups} --system {args.system} --qps {args.qps} --seed "
               f"{args.seed} --replicas {args.replicas} --kv-blocks {' '.join(map(str, args.kv_blocks))}` "
               f"(sessions: {args.sessions * args.turns} requests; groups: as many)")
    cells = [[r["trace"], r["router"], r["kv_blocks"], r["replica"], r["requests"], r["vllm_cached"],
              r["twin_serial_cached"], r["twin_routed_cached"], f"{r['equal']}/{r['requests']}",
              r["routed_blocks"], "yes" if r["same_blocks"] else "no"] for r in rows]
    align = "|---|---|" + "---:|" * (len(COLUMNS) - 3) + "---|"
    return markdown_section(SECTION, command, ABOUT, COLUMNS, align, cells)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=8)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--system", type=int, default=256, help="shared system prompt tokens")
    p.add_argument("--groups", type=int, default=4, help="system prompts of the groups trace")
    p.add_argument("--qps", type=float, default=5.0, help="sessions (groups: requests) per second")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--kv-blocks", type=int, nargs="+", default=[400], help="KV blocks of 128 per replica")
    p.add_argument("--out", type=Path, help="markdown file to write the section into")
    args = p.parse_args()
    text = table(run(args), args)
    print(text)
    if args.out is not None:
        write_section(args.out, text, SECTION)


if __name__ == "__main__":
    main()
