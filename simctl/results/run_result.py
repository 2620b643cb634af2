"""What one run yields, in simulated or real time: its request rows, its constant-memory iteration and
token-gap records, the queue seen at each arrival, and whether it stopped early."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from simctl.policies.seq import Seq
from simctl.serving.loop import Replica
from simctl.serving.records import GapHistogram, IterationLog, request_frame


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
