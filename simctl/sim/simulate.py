"""Simulate one replica over a list of requests, given its policy and cost model: a cluster of one; or
replicas behind a router, given their policies (`simulate_routed`)."""

from __future__ import annotations

import time

import simpy

from simctl.costs.base import CostModel
from simctl.policies.base import Policy
from simctl.results.run_result import SimResult
from simctl.serving.routers import make_router
from simctl.sim.cluster import Cluster, Member, Pool, Progress
from simctl.sim.replica import CostBackend
from simctl.traces.request import Request


def simulate(requests: list[Request], policy: Policy, cost: CostModel, fast: bool = True,
             max_waiting: int | None = None, progress: Progress | None = None,
             backend: CostBackend | None = None, concurrency: int | None = None, think_s: float = 0.0
             ) -> SimResult:
    """Replay `requests` (sorted by arrival) through `policy` on hardware priced by `cost` (or by `backend`, a
    CostBackend that also records, e.g. simctl.sim.timeline's), sent by `concurrency` closed-loop clients
    pausing `think_s` (None: open loop); `progress(arrived, total)` is called every few thousand events, if
    given."""
    t0 = time.perf_counter()
    cluster = Cluster(simpy.Environment())
    member = Member(0, policy, backend or CostBackend(cost, fast), max_waiting, cluster.on_release)
    cluster.entry = Pool("replicas", [member], make_router("round-robin"))
    seqs = cluster.run(requests, progress, concurrency, think_s)
    return SimResult.of(seqs, member.replica, time.perf_counter() - t0)


def simulate_routed(requests: list[Request], policies: list[Policy], cost: CostModel, router: str
                    ) -> list[list[int]]:
    """Serve `requests` on one replica per policy (each left as the run leaves it: its cache, its counters)
    behind `router`; the ids of the requests routed to each replica, in the order they were."""
    cluster = Cluster(simpy.Environment())
    members = [Member(i, p, CostBackend(cost), None, cluster.on_release) for i, p in enumerate(policies)]
    cluster.entry = Pool("replicas", members, make_router(router, [p.kv for p in policies]))
    cluster.run(requests)
    return [[s.id for s in m.seqs] for m in members]
