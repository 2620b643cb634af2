"""What one run yields, in simulated or real time: its request rows, its constant-memory iteration and
token-gap records, the queue seen at each arrival, and whether it stopped early."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import numpy as np

from simctl.policies.seq import Seq
from simctl.serving.loop import Replica
from simctl.serving.records import GapHistogram, IterationLog, request_columns

if TYPE_CHECKING:
    import pandas as pd


@dataclass
class SimResult:
    # one row per request, by column (records.request_columns): the summary reads these, and a run that
    # writes no table never imports pandas (about half a second of a short run's start-up, issue 42)
    request_columns: dict[str, np.ndarray]
    iterations: IterationLog
    gaps: GapHistogram  # time between consecutive tokens, weighted
    queue_at_arrival: np.ndarray  # waiting-queue length seen at each arrival
    aborted: bool  # stopped early: the waiting queue passed its limit
    kv_capacity: int
    wall_s: float

    @cached_property
    def requests(self) -> pd.DataFrame:
        """The request columns as a table, built on first use (files, plots, studies' tables)."""
        import pandas as pd

        return pd.DataFrame(self.request_columns)

    @classmethod
    def of(cls, seqs: list[Seq], replica: Replica, wall_s: float) -> SimResult:
        records = replica.records
        return cls(request_columns=request_columns(seqs), iterations=records.iterations, gaps=records.gaps,
                   queue_at_arrival=records.queue_lengths(), aborted=replica.aborted,
                   kv_capacity=replica.policy.kv.capacity, wall_s=wall_s)
