"""A real run's iteration log as the replica loop's clock and backend: the same policy re-plans every logged
iteration at its logged start, and each plan "runs" for its logged duration. Used to put the cost model's
price of every real iteration next to its measured time (`simctl.validation.validate`)."""

from __future__ import annotations

from collections.abc import Callable, Generator

import numpy as np
import pandas as pd

from simctl.policies.base import Policy
from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Seq
from simctl.serving.inbox import Inbox

LOGGED = ("prefill_tokens", "decode_tokens", "batch_size", "linear_tokens")  # what identifies a logged plan


class _End(Exception):
    """The log is exhausted, or the re-planned run left it (a plan or an idle wait the real run did not
    have)."""


class LoggedRun:
    # plan, start, duration
    def __init__(self, iterations: pd.DataFrame, on_iteration: Callable[[BatchPlan, float, float], None]
                 ) -> None:
        self.starts = iterations["start_s"].to_numpy()
        self.durations = iterations["duration_s"].to_numpy()
        self.logged = iterations[list(LOGGED)].to_numpy()
        self.on_iteration = on_iteration
        self.i = 0  # the next logged iteration
        self.matched = 0
        self.last_end: float | None = None
        self.between_s = 0.0  # time between iterations while work was pending (sampling, bookkeeping)
        self.between_n = 0
        self.policy: Policy | None = None
        self.inbox: Inbox | None = None

    def watch(self, policy: Policy, inbox: Inbox) -> None:
        """The replica's policy and inbox, to tell whether the real engine had work pending between
        iterations."""
        self.policy, self.inbox = policy, inbox

    # ---- clock ---------------------------------------------------------------------------------------------
    def now(self, exact: float) -> float:
        if self.i == len(self.starts) or exact > self.starts[self.i]:
            raise _End
        start = float(self.starts[self.i])
        if self.last_end is not None and (not self.policy.idle or self.inbox.next_time <= self.last_end):
            self.between_s += start - self.last_end  # the engine went straight to the next iteration
            self.between_n += 1
        self.last_end = None
        return start

    def drive(self, loop: Generator[float, None, None]) -> None:
        try:
            for _ in loop:
                pass  # no time passes: every start and end comes from the log
        except _End:
            pass

    # ---- backend -------------------------------------------------------------------------------------------
    def run(self, plan: BatchPlan, start: float) -> float:
        shape = (plan.prefill_tokens, plan.decode_tokens, len(plan.seqs), plan.linear_tokens)
        if shape != tuple(int(v) for v in self.logged[self.i]):
            raise _End
        end = float(self.starts[self.i] + self.durations[self.i])
        self.on_iteration(plan, start, float(self.durations[self.i]))
        self.matched += 1
        self.i += 1
        self.last_end = end
        return end

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray | None:
        return None  # the log has one row per iteration

    def release(self, finished: list[Seq]) -> None:
        pass
