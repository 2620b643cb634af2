"""Closed-loop speed (issue 37): the wall time of a closed-loop run beside the same trace served open loop.

Open loop, a lone replica takes every arrival ahead (`Member.take_ahead`) and runs without a SimPy event per
request; closed loop, every request is sent when a client is free and routed then (`sim.cluster.ClosedLoop`).
Three runs per deployment, same requests (sharegpt lengths, seed 0): open loop at --qps Q; closed loop at Q
with a client bound that never binds (the same schedule, so the difference is the routed path's cost alone);
and closed loop without a rate at the concurrency the open loop held on average (`in_flight_mean` of the
second run), every request ready at t=0. Each time is the best of `--repeats` of the simulation alone
(`sim_wall_s`). Target: closed loop within 1.5x of open loop. Prints a Markdown table for
bench/results/sessions.md.
"""

from __future__ import annotations

import argparse
from typing import Any

from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload

POLICY = "sarathi"


def best(config: RunConfig, cluster: ClusterConfig, repeats: int) -> dict[str, Any]:
    runs = [run(config, cluster).summary for _ in range(repeats)]
    return min(runs, key=lambda s: s["sim_wall_s"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=5000)
    ap.add_argument("--qps", type=float, default=1.5, help="per replica")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    print("| deployment | run | requests/s served | in flight (mean) | sim wall s | vs open loop |")
    print("|---|---|---:|---:|---:|---:|")
    for replicas in (1, 4):
        cluster = ClusterConfig(replicas=replicas, router="least-outstanding")
        load = Workload(trace="sharegpt", qps=args.qps * replicas, num_requests=args.requests, seed=0)
        config = RunConfig(policy=POLICY, workload=load)
        open_loop = best(config, cluster, args.repeats)
        bound = best(config.with_workload(concurrency=args.requests), cluster, args.repeats)
        held = max(1, round(bound["in_flight_mean"]))
        closed = best(config.with_workload(qps=None, concurrency=held), cluster, args.repeats)
        for name, s in ((f"open loop, {load.qps:g} QPS", open_loop),
                        (f"closed loop, {load.qps:g} QPS, bound {args.requests} (never binds)", bound),
                        (f"closed loop, concurrency {held}, no rate", closed)):
            print(f"| {POLICY} x{replicas} | {name} | {s['throughput_rps']:.3f} | "
                  f"{s.get('in_flight_mean', float('nan')):.2f} | {s['sim_wall_s']:.3f} | "
                  f"{s['sim_wall_s'] / open_loop['sim_wall_s']:.2f}x |")


if __name__ == "__main__":
    main()
