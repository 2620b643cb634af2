"""The replica loop (`serving.loop.Replica`) in simulated time: SimPy's clock, and a cost model as the backend.

The loop keeps its own exact clock (every time a running sum of iteration durations added one at a time, in
both the stepping and the stretch paths), so a stretch ends exactly where stepping would have; SimPy's clock,
advanced by a stretch's total, can differ from it in the last bit, and only orders events between processes.
"""

from __future__ import annotations

from collections.abc import Generator

import numpy as np
import simpy

from policies.plan import BatchPlan
from policies.seq import Seq
from serving.loop import Replica
from sim.cost.base import CostModel


class SimulatedTime:
    """A replica's clock in a simulation: the loop's exact time, unchanged."""

    def now(self, exact: float) -> float:
        return exact


class CostBackend:
    """Executes a plan by pricing it: the iteration ends `cost.iteration_time(plan)` after it starts."""

    def __init__(self, cost: CostModel, fast: bool = True) -> None:
        self.cost = cost
        self.fast = fast  # price stretches in closed form (identical results, fewer steps)

    def run(self, plan: BatchPlan, start: float) -> float:
        return start + self.cost.iteration_time(plan)

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray | None:
        return self.cost.stretch_times(plan, k) if self.fast else None

    def release(self, finished: list[Seq]) -> None:
        pass  # a priced iteration holds nothing beyond the policy's KV accounting


YIELD_EVERY = 1024  # at most this many waits run without handing control back to SimPy (progress reports)


def process(env: simpy.Environment, replica: Replica) -> Generator[simpy.Event, None, None]:
    """The replica's loop as a SimPy process: a wait becomes a timeout when another event is due before it ends.

    A wait that ends strictly before the next event in SimPy's queue cannot be interleaved with anything (no
    other process runs before then, so none can push to this replica's inbox), so the loop goes straight on:
    a lone replica makes a SimPy event only every `YIELD_EVERY` waits. Its own clock is exact either way, so
    results are the same; a tie with another event still goes through SimPy, which orders it.
    """
    ran = 0
    for until in replica.serve(env.now):
        if until < env.peek() and ran < YIELD_EVERY:
            ran += 1
            continue
        ran = 0
        yield env.timeout(max(until - env.now, 0.0))
