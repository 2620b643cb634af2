"""How far apart do simulated runs of llm-d's experiment (bench/routing_llmd.py) land from seed to seed, and
is the published gap between random and load-aware routing (random 4% ahead in output tok/s, one run each)
inside that spread? And does llm-d's view of the replicas (its scorers read their queues and KV use as
scraped every 50 ms from vLLM's metrics) change the order?

Each seed draws its own trace (the prompts' shuffle and the Poisson gaps, `requests(seed=)`) and random's
own picks; load (and any other router named) runs on the same trace at each scrape interval in `--lags`
(0: the replicas as they are), reading at each scrape what `--view` says. Prints each run (with the P90 TTFT
of the 3, 10 and 15 QPS stages, where the published load router was slower than random), then per router and
lag the mean, standard deviation and range over the seeds, and load less random on the same trace.

Usage: python research/routing_seeds.py [--seeds 0,1,2,3,4] [--routers random,load] [--lags 0,0.05]
       [--view step|exact|engine] [--output 1000] [--jobs 2]
"""

from __future__ import annotations

import argparse

import numpy as np
from routing_load_random import bench_module, rows_in_pool

from simctl.serving.router_base import ReplicaView
from simctl.sim.cluster import Member

BENCH = bench_module()


def engine_view(member: Member) -> ReplicaView:
    """What vLLM's metrics would show of a replica if they were made at every instant: its scheduler's waiting
    queue now, without the requests routed there and not yet taken in (vLLM's engine core takes new requests
    between steps: v1/engine/core.py)."""
    p = member.policy
    return ReplicaView(len(p.waiting) + len(p.arrived_with_kv), member.inbox.pushed - member.released,
                       p.kv.used)


# what a scraping router (lag > 0) reads of a replica: the product's (as its engine's last step left it), the
# replica as it is (the product's before 2026-11-28), or `engine_view`
VIEWS = {"step": Member.scraped_view, "exact": Member.view, "engine": engine_view}


def run(router: str, lag: float, seed: int, output: int, view: str = "step") -> dict:
    Member.scraped_view = VIEWS[view]  # the pools built from here on read it (a Pool takes it when made)
    reqs, stage_of = BENCH.requests(BENCH.STAGES, output, seed)
    r = BENCH.serve(router, reqs, stage_of, BENCH.STAGES, lag=lag, seed=seed)
    name = router + (f" ({view} view)" if lag and router in BENCH.SCRAPED else "")
    return {"router": name, "lag": lag, "seed": seed, "tok_s": r.tok_s, "ttft_p90": r.ttft_p90,
            "ttft_mean": r.ttft_mean, "made": r.made_tok_s, "hits": r.hit_rate, "cpu_s": r.cpu_s,
            "stages": [round(t) for t in r.stage_tok_s], "low_p90": r.stage_ttft_p90[:3]}


def spread(xs: list[float]) -> str:
    a = np.array(xs)
    return f"{a.mean():,.0f} (sd {a.std(ddof=1):,.0f}, {a.min():,.0f}-{a.max():,.0f})"


def summary(rows: list[dict]) -> list[str]:
    lines = ["", "| router | lag s | output tok/s: mean (sd, range) | P90 TTFT s: mean (sd, range) |",
             "|---|---:|---|---|"]
    groups = dict.fromkeys((r["router"], r["lag"]) for r in rows)
    for router, lag in groups:
        mine = [r for r in rows if (r["router"], r["lag"]) == (router, lag)]
        p90 = np.array([r["ttft_p90"] for r in mine])
        lines.append(f"| {router} | {lag:g} | {spread([r['tok_s'] for r in mine])} | {p90.mean():.1f} "
                     f"(sd {p90.std(ddof=1):.1f}, {p90.min():.1f}-{p90.max():.1f}) |")
    random = {r["seed"]: r for r in rows if r["router"] == "random"}
    lines += ["", "Load less random on the same trace, per seed (output tok/s %, P90 TTFT %):"]
    for router, lag in groups:
        if router.split()[0] != "load":
            continue
        diffs = [(100 * (r["tok_s"] / random[r["seed"]]["tok_s"] - 1),
                  100 * (r["ttft_p90"] / random[r["seed"]]["ttft_p90"] - 1))
                 for r in rows if (r["router"], r["lag"]) == (router, lag) and r["seed"] in random]
        lines.append(f"- lag {lag:g} s: " + ", ".join(f"{a:+.1f}/{b:+.1f}" for a, b in diffs)
                     + f"; random ahead in throughput on {sum(a < 0 for a, _ in diffs)} of {len(diffs)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--routers", default="random,load")
    parser.add_argument("--lags", default="0,0.05", help="scrape intervals, seconds (random reads none)")
    parser.add_argument("--output", type=int, default=BENCH.OUTPUT)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--view", choices=VIEWS, default="step",
                        help="what a scraping router reads of a replica (lag > 0): as its last step left it "
                             "(step, the product's), as it is (exact), its scheduler's queue now (engine)")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    lags = [float(x) for x in args.lags.split(",")]
    todo = [(router, lag if router in BENCH.SCRAPED else 0.0, seed, args.output, args.view)
            for router in args.routers.split(",") for lag in (lags if router in BENCH.SCRAPED else lags[:1])
            for seed in seeds]
    header = ("| router | lag s | seed | output tok/s | P90 TTFT s | mean TTFT s | generated tok/s | "
              "hit rate | P90 TTFT s at 3, 10, 15 QPS | CPU s |\n"
              "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    rows = rows_in_pool(run, todo, args.jobs, header, lambda r: (
        f"| {r['router']} | {r['lag']:g} | {r['seed']} | {r['tok_s']:,.0f} | {r['ttft_p90']:.1f} | "
        f"{r['ttft_mean']:.1f} | {r['made']:,.0f} | {r['hits']:.1%} | "
        f"{', '.join(f'{t:.2f}' for t in r['low_p90'])} | {r['cpu_s']:.0f} |"))
    print("\n".join(summary(rows)))
    for r in rows:
        print(f"<!-- {r['router']} lag {r['lag']:g} seed {r['seed']} stages: {r['stages']} -->")


if __name__ == "__main__":
    main()
