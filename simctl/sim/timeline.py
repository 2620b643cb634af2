"""Which requests ran in each iteration, for a bounded window: what `simctl run --timeline N` records.

A run's own records are constant-memory rows with counts (serving/records.py); an iteration timeline
(Sarathi-Serve Figure 4) needs each iteration's members, so this backend records them for the first `limit`
iterations only (at most MAX_TIMELINE_ITERATIONS). It prices exactly as `CostBackend`, and steps decode
stretches one iteration at a time while it records (stepping and stretches agree to rounding, 1e-12 relative:
`tests/test_sim_cases.py`), so every recorded iteration is one row per member.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.policies.plan import BatchPlan
from simctl.sim.replica import CostBackend

if TYPE_CHECKING:
    import pandas as pd

MAX_TIMELINE_ITERATIONS = 10_000  # x at most a batch of members each: a few million rows at the most


def check_timeline(limit: int) -> None:
    if not 0 <= limit <= MAX_TIMELINE_ITERATIONS:
        raise InputError(
            f"--timeline {limit}: record from 1 to {MAX_TIMELINE_ITERATIONS} iterations (0: none)")


class TimelineBackend(CostBackend):
    def __init__(self, cost: CostModel, fast: bool, limit: int) -> None:
        super().__init__(cost, fast)
        check_timeline(limit)
        self.limit = limit
        self.recorded = 0
        self._rows: dict[str, list] = {k: [] for k in ("iteration", "start_s", "end_s", "request_id",
                                                       "tokens", "prefill")}

    def run(self, plan: BatchPlan, start: float) -> float:
        end = super().run(plan, start)
        if self.recorded < self.limit:
            rows = self._rows
            for seq, q in zip(plan.seqs, plan.num_new):
                rows["iteration"].append(self.recorded)
                rows["start_s"].append(start)
                rows["end_s"].append(end)
                rows["request_id"].append(seq.id)
                rows["tokens"].append(q)
                rows["prefill"].append(seq.in_prefill)  # read before the iteration is applied
            self.recorded += 1
        return end

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray | None:
        return None if self.recorded < self.limit else super().stretch_times(plan, k)

    def frame(self) -> pd.DataFrame:
        """One row per (iteration, member): its times, the request, the tokens it cached, prefill or
        decode."""
        import pandas as pd  # the run's other tables are built on demand too: a summary needs none

        types = {"iteration": np.int64, "start_s": np.float64, "end_s": np.float64, "request_id": np.int64,
                 "tokens": np.int64, "prefill": bool}
        return pd.DataFrame({k: np.asarray(v, dtype=types[k]) for k, v in self._rows.items()})
