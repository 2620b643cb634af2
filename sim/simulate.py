"""Simulate one replica over a list of requests, given its policy and cost model: a cluster of one."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from policies.base import Policy
from policies.seq import Seq
from serving.loop import Replica
from serving.records import GapHistogram, IterationLog, request_frame
from serving.routers import make_router
from sim.cluster import Cluster, Member, Pool, Progress
from sim.cost.base import CostModel
from sim.replica import CostBackend
from traces.request import Request


@dataclass
class SimResult:
    requests: pd.DataFrame  # one row per request (records.request_frame)
    iterations: IterationLog
    gaps: GapHistogram  # time between consecutive tokens, weighted
    queue_at_arrival: np.ndarray  # waiting-queue length seen at each arrival
    aborted: bool  # stopped early: the waiting queue passed its limit
    kv_capacity: int
    wall_s: float

    @classmethod
    def of(cls, seqs: list[Seq], replica: Replica, wall_s: float) -> SimResult:
        records = replica.records
        return cls(requests=request_frame(seqs), iterations=records.iterations, gaps=records.gaps,
                   queue_at_arrival=records.queue_lengths(), aborted=replica.aborted,
                   kv_capacity=replica.policy.kv.capacity, wall_s=wall_s)


def simulate(requests: list[Request], policy: Policy, cost: CostModel, fast: bool = True,
             max_waiting: int | None = None, progress: Progress | None = None,
             backend: CostBackend | None = None) -> SimResult:
    """Replay `requests` (sorted by arrival) through `policy` on hardware priced by `cost` (or by `backend`, a
    CostBackend that also records, e.g. sim.timeline's); `progress(arrived, total)` is called every few
    thousand events, if given."""
    t0 = time.perf_counter()
    cluster = Cluster(simpy.Environment())
    member = Member(0, policy, backend or CostBackend(cost, fast), max_waiting, cluster.on_release)
    cluster.entry = Pool("replicas", [member], make_router("round-robin"))
    seqs = cluster.run(requests, progress)
    return SimResult.of(seqs, member.replica, time.perf_counter() - t0)
