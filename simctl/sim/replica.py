"""A replica in simulated time: its clock and its backend, a cost model (`sim.cluster` drives its loop).

The loop keeps its own exact clock (every time a running sum of iteration durations added one at a time, in
both the stepping and the stretch paths), so a stretch ends exactly where stepping would have; SimPy's clock,
advanced by a stretch's total, can differ from it in the last bit, and only orders events between processes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from simctl.costs.base import CostModel
from simctl.costs.pipeline import StagedCost
from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Seq
from simctl.serving.pipeline import Pipeline


class SimulatedTime:
    """A replica's clock in a simulation: the loop's exact time, unchanged."""

    def now(self, exact: float) -> float:
        return exact


class CostBackend:
    """Executes a plan by pricing it: the iteration ends `cost.iteration_time(plan)` after it starts."""

    def __init__(self, cost: CostModel, fast: bool = True) -> None:
        self.cost = cost
        self.fast = fast  # price stretches in closed form (identical results, fewer steps)
        self.on_release: Callable[[list[Seq]], None] | None = None  # set by the cluster member it serves

    @property
    def admission_s(self) -> float:
        return self.cost.admission_s

    def run(self, plan: BatchPlan, start: float) -> float:
        return start + self.cost.iteration_time(plan)

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray | None:
        return self.cost.stretch_times(plan, k) if self.fast else None

    def release(self, finished: list[Seq]) -> None:
        # a priced iteration holds nothing beyond the policy's KV accounting; the cluster learns who left
        if self.on_release is not None:
            self.on_release(finished)


class StageBackend(CostBackend):
    """A virtual engine of a pipeline-parallel replica (`serving.pipeline`): its micro-batch ends when it
    leaves the last of the stages it shares with the replica's other virtual engines. Priced an iteration at
    a time: a stretch's repeats interleave with the other engines' micro-batches."""

    def __init__(self, cost: CostModel, staged: StagedCost, pipeline: Pipeline) -> None:
        super().__init__(cost, fast=False)
        self.staged, self.pipeline = staged, pipeline
        self.bubbles: dict[int, float] = {}  # request id -> its micro-batches' bubbles, until it finishes

    def run(self, plan: BatchPlan, start: float) -> float:
        staged, pipeline = self.staged, self.pipeline
        end = pipeline.submit(start, *staged.stage_times(plan), staged.boundary_time(plan))
        if b := pipeline.last_bubble_s:
            bubbles = self.bubbles
            for s in plan.seqs:
                bubbles[s.id] = bubbles.get(s.id, 0.0) + b
        return end

    def release(self, finished: list[Seq]) -> None:
        for s in finished:
            self.pipeline.request_bubbles.add(self.bubbles.pop(s.id, 0.0), 1)
        super().release(finished)
