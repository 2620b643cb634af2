"""One serving replica as a SimPy process: schedule, price, wait, apply, record.

The fast path: a decode-only plan that the policy would repeat unchanged (nothing arrives, nothing finishes,
KV suffices) is executed as one stretch of k iterations whose durations come from the cost model in closed
form. Per-token outcomes are identical to stepping one iteration at a time; only the bookkeeping is batched.

The bookkeeping of one executed iteration (`apply_iteration`, `close_iterations`) is shared with the real
engine (`engine/serve.py`), which times real forwards instead of pricing plans.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np
import simpy

from policies.base import Policy
from policies.plan import BatchPlan
from policies.seq import Seq
from sim.cost.base import CostModel
from sim.records import GapHistogram, IterationLog

MAX_STRETCH = 4096  # longest decode stretch priced at once; bounds the arrays, not the results


@dataclass
class ArrivalQueue:
    """Requests in arrival order, handed to the replica as simulated time reaches them."""

    seqs: list[Seq]
    next: int = 0

    @property
    def next_time(self) -> float:
        return self.seqs[self.next].arrival_s if self.next < len(self.seqs) else float("inf")

    def pop_due(self, now: float) -> list[Seq]:
        start = self.next
        while self.next < len(self.seqs) and self.seqs[self.next].arrival_s <= now:
            self.next += 1
        return self.seqs[start:self.next]


@dataclass
class Replica:
    env: simpy.Environment
    policy: Policy
    cost: CostModel
    arrivals: ArrivalQueue
    fast: bool = True
    max_waiting: int | None = None  # give up (overload) once this many requests wait
    iterations: IterationLog = field(default_factory=IterationLog)
    gaps: GapHistogram = field(default_factory=GapHistogram)
    queue_at_arrival: list[int] = field(default_factory=list)
    aborted: bool = False

    def run(self) -> Generator[simpy.Event, None, None]:
        """The replica keeps its own exact clock, `now`: every time is a running sum of iteration durations
        added one at a time, in both paths, so a stretch ends exactly where stepping would have (SimPy's
        clock, advanced by the stretch's total, can differ from it in the last bit)."""
        env, policy = self.env, self.policy
        now = env.now
        while True:
            if self.arrivals.next_time <= now:
                for seq in self.arrivals.pop_due(now):
                    policy.add(seq)
                    self.queue_at_arrival.append(len(policy.waiting))
                if self.max_waiting is not None and len(policy.waiting) > self.max_waiting:
                    self.aborted = True
                    return
            plan = policy.schedule()
            if plan is None:
                if self.arrivals.next_time == float("inf"):
                    return
                yield env.timeout(max(self.arrivals.next_time - env.now, 0.0))
                now = self.arrivals.next_time
                continue
            ends = self._stretch(plan, now) if self.fast and plan.decode_only else None
            if ends is None:
                end = now + self.cost.iteration_time(plan)
                yield env.timeout(max(end - env.now, 0.0))
                apply_iteration(policy, self.iterations, self.gaps, plan, now, end)
            else:
                end = float(ends[-1])
                yield env.timeout(max(end - env.now, 0.0))
                self._apply_stretch(plan, now, ends)
            now = end

    def _stretch(self, plan: BatchPlan, now: float) -> np.ndarray | None:
        """End times of the identical decode iterations this plan can run back to back (None: just one)."""
        extra = min(min(s.output_tokens - s.generated for s in plan.seqs) - 1, MAX_STRETCH - 1)
        if extra <= 0:
            return None
        durations = self.cost.decode_stretch_times(plan, extra + 1)
        ends = np.cumsum(np.concatenate(([now], durations)))[1:]  # sequential adds, as stepping does
        # stop at the iteration that ends at or after the next arrival: the policy decides again after it
        extra = min(extra, int(np.searchsorted(ends, self.arrivals.next_time, side="left")))
        extra = self.policy.extend(plan, extra) if extra > 0 else 0
        return ends[:extra + 1] if extra > 0 else None

    def _apply_stretch(self, plan: BatchPlan, start: float, ends: np.ndarray) -> None:
        k = len(ends)
        first_end, last_end = float(ends[0]), float(ends[-1])
        prev_token: dict[float, int] = {}
        finished: list[Seq] = []
        for s in plan.seqs:  # k decode steps, each samples a token
            s.computed += k
            s.generated += k
            prev_token[s.last_token_s] = prev_token.get(s.last_token_s, 0) + 1
            s.last_token_s = last_end
            if s.generated == s.output_tokens:
                s.completion_s = last_end
                finished.append(s)
        self.gaps.extend(np.diff(ends), len(plan.seqs))  # later steps: every row waited one iteration
        close_iterations(self.policy, self.iterations, self.gaps, plan, start, last_end, k, prev_token,
                         finished, first_end)


# ---- per-iteration bookkeeping, shared with the real engine (engine/) -----------------------------------------


def apply_iteration(policy: Policy, iterations: IterationLog, gaps: GapHistogram, plan: BatchPlan, start: float,
                    end: float) -> list[Seq]:
    """Apply one executed iteration of `plan`, which began at `start` and whose tokens were sampled at `end`:
    advance every scheduled Seq by its new tokens, stamp first-scheduled / first-token / last-token /
    completion times, record the gaps between consecutive tokens, log the iteration row and release (via
    `policy.finish`) every sequence that sampled its last token. Returns those finished sequences.

    The simulator (Replica) and the real engine both call this, so the bookkeeping exists once."""
    prev_token: dict[float, int] = {}  # previous token time -> sequences sampling now, for TBT
    finished: list[Seq] = []
    nd = plan.decode_tokens
    seqs = plan.seqs
    consecutive = 0  # decodes whose previous token came at this iteration's start (the common case)
    for s in seqs[:nd]:  # decodes: Seq.advance(1), inlined on the hot path; each samples a token
        s.computed += 1
        g = s.generated = s.generated + 1
        if s.last_token_s == start:
            consecutive += 1
        else:
            prev_token[s.last_token_s] = prev_token.get(s.last_token_s, 0) + 1
        s.last_token_s = end
        if g == s.output_tokens:
            s.completion_s = end
            finished.append(s)
    if consecutive:
        prev_token[start] = prev_token.get(start, 0) + consecutive
    for s, q in zip(seqs[nd:], plan.num_new[nd:]):  # prefill segments
        if s.first_scheduled_s < 0:
            s.first_scheduled_s = start
        if not s.advance(q):
            continue  # a chunk short of the last known token samples nothing
        if s.first_token_s < 0:
            s.first_token_s = end
        else:  # re-prefilled after a preemption: the user saw a long gap
            prev_token[s.last_token_s] = prev_token.get(s.last_token_s, 0) + 1
        s.last_token_s = end
        if s.generated == s.output_tokens:
            s.completion_s = end
            finished.append(s)
    close_iterations(policy, iterations, gaps, plan, start, end, 1, prev_token, finished)
    return finished


def close_iterations(policy: Policy, iterations: IterationLog, gaps: GapHistogram, plan: BatchPlan,
                     start: float, end: float, k: int, prev_token: dict[float, int], finished: list[Seq],
                     first_end: float | None = None) -> None:
    """Record the TBT gaps ending at the first of `k` iterations (`first_end`, default `end`), release the
    finished sequences and log one iteration row (`k` iterations from `start` to `end`)."""
    first_end = end if first_end is None else first_end
    for t, n in prev_token.items():
        gaps.add(first_end - t, n)
    kv_used = policy.kv.used
    for s in finished:
        policy.finish(s)
    iterations.add(start, end - start, k, plan.prefill_tokens, plan.decode_tokens, len(plan.seqs),
                   plan.linear_tokens, kv_used)
