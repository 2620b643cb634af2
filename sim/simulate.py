"""Run one replica over a list of requests and collect its records."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from policies.base import Policy
from policies.seq import Seq
from serving.inbox import Inbox
from serving.loop import Replica
from serving.records import GapHistogram, IterationLog, request_frame
from sim.cost.base import CostModel
from sim.replica import CostBackend, SimulatedTime, process
from traces.request import Request

Progress = Callable[[int, int], None]  # (requests arrived, requests in all)
PROGRESS_EVERY = 8  # SimPy events between two progress reports (a replica yields every YIELD_EVERY waits)


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
    seqs = [Seq.of(r) for r in requests]
    env = simpy.Environment()
    replica = Replica(policy, backend or CostBackend(cost, fast), SimulatedTime(), Inbox(seqs),
                      max_waiting=max_waiting)
    env.process(process(env, replica))
    if progress is None:
        env.run()
    else:
        arrivals = replica.records.queue_at_arrival  # one entry per request arrived
        try:
            while True:
                for _ in range(PROGRESS_EVERY):
                    env.step()
                progress(len(arrivals), len(seqs))
        except simpy.core.EmptySchedule:  # what ends env.run() too
            progress(len(seqs), len(seqs))
    return SimResult.of(seqs, replica, time.perf_counter() - t0)
