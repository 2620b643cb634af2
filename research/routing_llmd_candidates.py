"""Which of the named candidates puts llm-d's load-aware router behind random in output throughput, as the
published run has it (random 4,429, load 4,266 tok/s), in simctl's llm-d experiment (bench/routing_llmd.py,
routers reading vLLM's metrics scraped every 50 ms)?

Candidates, each set from a cited fact (none tuned):
- `front-end`: the gateway picks a replica when the request is sent; the replica's own `vllm serve` API server
  (HTTP, tokenization) then takes it before its engine sees it: one server per replica, first come first
  served, 4.4 ms + 6 us a prompt token (research/results/front_end_vllm_serve.md, measured on this CPU with
  vLLM 0.32; 48 ms for a 7,200-token prompt). Meanwhile the replica's scraped queue does not show it. (The
  product's front end sits before routing, one queue for the pool: `serving.front_end`.)
- `tie-random`: llm-d's `max-score-picker` shuffles the scored endpoints, then stable-sorts them by score, so
  equal scores are broken at random (gateway-api-inference-extension
  pkg/epp/scheduling/framework/plugins/picker/max_score_picker.go, `Pick`: "Shuffle in-place - needed for
  random tie break when scores are equal"); simctl's load router breaks them by fewer outstanding requests
  (its own live count), then the lower index. Applied here by handing the router the views shuffled and
  with their outstanding counts zeroed, so its first-of-equals is a uniformly random one of them.
- `delay=S`: a sensitivity, not a cited value: S seconds between the pick and the engine seeing the request
  (what a gateway's path after the pick, or any other delay there, would add), per replica, pipelined.

Usage: python research/routing_llmd_candidates.py [--seeds 0,1,2] [--candidates base,front-end,tie-random,
       front-end+tie-random] [--routers random,load] [--jobs 2]
"""

from __future__ import annotations

import argparse
import random
from dataclasses import replace

import numpy as np
from routing_load_random import bench_module, rows_in_pool

from simctl.serving.front_end import FrontEnd, FrontEndQueue
from simctl.sim.cluster import Cluster, Member

BENCH = bench_module()
CLUSTER_OF = BENCH.cluster_of
VLLM_SERVE = FrontEnd(request_s=0.0044, prompt_token_s=6e-6)  # results/front_end_vllm_serve.md
TIES = {"decisions": 0, "tied": 0}  # this process's load decisions, and those with a tie at the top


def front_end_after_pick(cluster: Cluster, work: FrontEnd, latency_s: float = 0.0) -> None:
    """Route each request when it is sent, then pass it through its replica's own front end."""
    pool = cluster.entry
    pool.due = lambda sent_s, seq: sent_s  # the pool's own front end is off (NO_FRONT_END): routed at send
    for m in pool.members:
        queue = FrontEndQueue(work, m.admission_s + latency_s)
        m.push = lambda seq, sent, m=m, queue=queue: Member.push(m, seq, queue.due(sent, seq.prompt_tokens))


def tie_random(cluster: Cluster, seed: int) -> None:
    """llm-d's max-score-picker in front of the pool's scored router: shuffle, zero the router's own count."""
    inner, rng = cluster.entry.router, random.Random(1000 + seed)

    def pick(views, seq=None):
        order = list(range(len(views)))
        rng.shuffle(order)
        shuffled = [replace(views[i], outstanding=0) for i in order]
        first = inner(shuffled, seq)
        TIES["decisions"] += 1
        TIES["tied"] += inner(shuffled[::-1], seq) != len(views) - 1 - first  # another max exists
        return order[first]
    cluster.entry.router = pick


def run(router: str, candidate: str, seed: int, output: int) -> dict:
    parts = candidate.split("+")

    def cluster_of(router_name, caching=True, lag=BENCH.SCRAPE_S, seed=0, cost=None):
        cluster = CLUSTER_OF(router_name, caching, lag, seed, cost)
        for part in parts:
            if part == "front-end":
                front_end_after_pick(cluster, VLLM_SERVE)
            elif part.startswith("delay="):
                front_end_after_pick(cluster, FrontEnd(), float(part.split("=")[1]))
            elif part == "tie-random" and router_name != "random":
                tie_random(cluster, seed)
            elif part not in ("base", "tie-random"):
                raise SystemExit(f"unknown candidate {part!r}")
        return cluster

    BENCH.cluster_of = cluster_of
    TIES.update(decisions=0, tied=0)
    reqs, stage_of = BENCH.requests(BENCH.STAGES, output, seed)
    r = BENCH.serve(router, reqs, stage_of, BENCH.STAGES, seed=seed)
    tied = TIES["tied"] / TIES["decisions"] if TIES["decisions"] else float("nan")
    return {"router": router, "candidate": candidate, "seed": seed, "tok_s": r.tok_s, "p90": r.ttft_p90,
            "made": r.made_tok_s, "low_p90": r.stage_ttft_p90[:3], "tied": tied, "cpu_s": r.cpu_s}


def summary(rows: list[dict]) -> list[str]:
    head = ("| candidate | random tok/s (seeds) | load tok/s (seeds) | load - random, per seed | "
            "P90 TTFT load - random, per seed | load decisions tied |")
    lines = ["", head, "|---|---|---|---|---|---:|"]
    for cand in dict.fromkeys(r["candidate"] for r in rows):
        by = {(r["router"], r["seed"]): r for r in rows if r["candidate"] == cand}
        seeds = sorted({s for _, s in by})
        pairs = [(by["random", s], by["load", s]) for s in seeds if ("random", s) in by and ("load", s) in by]
        gap = [100 * (b["tok_s"] / a["tok_s"] - 1) for a, b in pairs]
        p90 = [100 * (b["p90"] / a["p90"] - 1) for a, b in pairs]
        ties = [b["tied"] for _, b in pairs if not np.isnan(b["tied"])]
        rand = ", ".join(f"{a['tok_s']:,.0f}" for a, _ in pairs)
        load = ", ".join(f"{b['tok_s']:,.0f}" for _, b in pairs)
        lines.append(
            f"| {cand} | {rand} | {load} | {', '.join(f'{g:+.1f}%' for g in gap)} "
            f"(mean {np.mean(gap):+.1f}%) | {', '.join(f'{g:+.1f}%' for g in p90)} | "
            f"{f'{np.mean(ties):.1%}' if ties else '-'} |")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--routers", default="random,load")
    parser.add_argument("--candidates", default="base,front-end,tie-random,front-end+tie-random")
    parser.add_argument("--output", type=int, default=BENCH.OUTPUT)
    parser.add_argument("--jobs", type=int, default=2)
    args = parser.parse_args()
    todo = [(router, cand, int(seed), args.output) for cand in args.candidates.split(",")
            for seed in args.seeds.split(",") for router in args.routers.split(",")
            if not (router == "random" and cand == "tie-random")]  # random has no scores to tie
    header = ("| router | candidate | seed | output tok/s | P90 TTFT s | generated tok/s | "
              "P90 TTFT s at 3, 10, 15 QPS | tied | CPU s |\n|---|---|---:|---:|---:|---:|---|---:|---:|")
    rows = rows_in_pool(run, todo, args.jobs, header, lambda r: (
        f"| {r['router']} | {r['candidate']} | {r['seed']} | {r['tok_s']:,.0f} | {r['p90']:.1f} | "
        f"{r['made']:,.0f} | {', '.join(f'{t:.2f}' for t in r['low_p90'])} | {r['tied']:.1%} | "
        f"{r['cpu_s']:.0f} |"))
    base_random = {r["seed"]: r for r in rows if r["router"] == "random" and r["candidate"] == "base"}
    for r in rows:  # tie-random leaves random as it is: its pair is the base run
        if r["candidate"] == "tie-random" and r["router"] == "load" and r["seed"] in base_random:
            rows.append({**base_random[r["seed"]], "candidate": "tie-random"})
    print("\n".join(summary(rows)))


if __name__ == "__main__":
    main()
