"""What runs a plan on a real model, as the replica loop's real-time backend sees it (implemented with torch
by `simctl.executor.plans.PlanExecutor`; a GPU engine with CUDA graphs is another implementation)."""

from __future__ import annotations

from typing import Protocol

from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Seq


class Executor(Protocol):
    def execute(self, plan: BatchPlan) -> list[tuple[Seq, int]]:
        """Run the plan's forward to completion; return the rows that sampled: (sequence, token id), in plan
        order. The sequences are not advanced: the loop's bookkeeping does that."""

    def release(self, finished: list[Seq]) -> None:
        """The sequences left the replica: free the KV they hold."""

    def tokens(self, seq_id: int) -> list[int]:
        """A request's generated token ids so far."""
