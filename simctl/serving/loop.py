"""The replica loop, written once: drain the inbox, schedule, execute, apply and record.

    loop:
        now = clock.now(exact)          # the simulator: its exact running sum; real time: the clock's reading
        hand every request due by `now` to the policy (policy.add)
        plan = policy.schedule()
        None  -> wait until the next request is due (or stop: none is left)
        plan  -> end = backend.run(plan, now); wait until `end`; apply the iteration's bookkeeping;
                 backend.release(finished)

The loop is a generator that yields each time it must wait until; a driver makes that time pass: SimPy's
environment for the simulator (`simctl.sim.replica`), sleeping on the monotonic clock for the real engine
(`simctl.serving.realtime`), nothing at all for the replay of a real run's log. As in SimPy's own real-time
environment, only how time advances differs; the loop, the policy and the bookkeeping are the same objects.

Stretches: a backend that can price `k` repeats of a plan at once (`stretch_times`) lets the loop run a
decode-only plan, or one the policy says it would repeat with its prefill chunks one chunk further
(`chunk_repeats`: Sarathi's long prompts), as one stretch until the next request is due in the inbox, a
sequence finishes or KV runs out (the waiting queue of every policy stays blocked while decodes only grow).
Per-token outcomes are identical to stepping one iteration at a time; only the bookkeeping is batched. When
the inbox may be pushed a request while the loop waits (`Inbox.pushed_while_serving`: a cluster's router), a
stretch's KV is allocated once it has run (`policy.repeats_allowed` bounds it before, so a router never sees
KV set aside ahead), and the driver resumes the wait early at a push by sending True: the loop then cuts the
stretch at the iteration during which that request arrived. An inbox holding every request ahead cannot cut
a stretch, and its KV is allocated when planned (`policy.extend`), one pass over the decodes instead of two.

A `Watch` sees the policy before each `schedule()`, each plan about to run and each plan once its bookkeeping
is applied: tests/policy_cases.py checks every plan of every policy through this very loop.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from simctl.policies.base import Policy
from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Seq
from simctl.serving.bookkeeping import apply_iteration, apply_stretch
from simctl.serving.inbox import Inbox
from simctl.serving.records import Records

MAX_STRETCH = 4096  # longest decode stretch priced at once; bounds the arrays, not the results


def overload_limit(arrivals: Sequence[float]) -> int:
    """Waiting requests past which a run of requests arriving at `arrivals` gives up as overloaded: half the
    run (more than half waiting at once is unsustainable by `results.metrics`' own verdict), at least 64 so
    that bursts of small runs finish, and at most 2048 so that an overload is detected in bounded time and
    memory however long the run. An offline batch (every request there at once, a throughput benchmark's
    workload) never gives up: its queue is the workload, not a rate the replica fails to keep up with, and
    its run ends once the batch is served."""
    n = len(arrivals)
    if n > 1 and min(arrivals) == max(arrivals):
        return n + 1
    return min(max(64, n // 2), 2048)


class Clock(Protocol):
    def now(self, exact: float) -> float:
        """The time at the top of an iteration. `exact` is the loop's own running sum of iteration ends and
        wake-up times: a simulated clock returns it unchanged (so a stretch ends exactly where stepping would
        have), a real clock returns its reading."""


class Watch(Protocol):
    """Sees every step of the loop (None: nothing watches; the simulator, the real engine, the replay)."""

    def scheduling(self) -> None:
        """The requests due are handed to the policy; `schedule()` is next."""

    def planned(self, plan: BatchPlan | None, extra: int) -> None:
        """What `schedule()` returned, before it runs, with the `extra` repeats the loop plans for it (their
        KV already held, unless the inbox is pushed while serving, whose pushes may also cut them short)."""

    def ran(self, plan: BatchPlan, finished: list[Seq]) -> None:
        """The plan (and its repeats) ran and its bookkeeping is applied: `finished` have left the policy."""


class Backend(Protocol):
    def run(self, plan: BatchPlan, start: float) -> float:
        """Execute (or price) `plan`, begun at `start`; return the time its tokens exist."""

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray | None:
        """Durations of `k` back-to-back repeats of a plan (`CostModel.stretch_times`; a fresh array, which
        the loop turns into end times in place), or None: one iteration at a time."""

    def release(self, finished: list[Seq]) -> None:
        """The sequences sampled their last token and left the policy: free what the backend holds for
        them."""


@dataclass
class Replica:
    policy: Policy
    backend: Backend
    clock: Clock
    inbox: Inbox
    max_waiting: int | None = None  # give up (overload) once this many requests wait
    records: Records = field(default_factory=Records)
    aborted: bool = False
    # The iteration ends of the stretch the loop waits through (None otherwise): a router may push a request
    # meanwhile (a cluster's replica), and its driver then resumes the loop early to cut the stretch there.
    stretch: np.ndarray | None = None
    max_stretch: int = MAX_STRETCH  # most iterations priced at once (1: one at a time)
    watch: Watch | None = None

    def serve(self, start: float = 0.0) -> Generator[float, None, None]:
        """The loop; yields each time until which the driver must let time pass before resuming it."""
        policy, inbox, backend, clock, records, watch = (self.policy, self.inbox, self.backend, self.clock,
                                                         self.records, self.watch)
        inf = float("inf")
        now = start
        while True:
            now = clock.now(now)
            if inbox.next_time <= now:
                for seq in inbox.pop_due(now):
                    policy.add(seq)
                    # queued: waiting for a prefill, or arrived with its KV and waiting for a slot
                    records.queue_at_arrival.append(len(policy.waiting) + len(policy.arrived_with_kv))
                if self.max_waiting is not None and len(policy.waiting) > self.max_waiting:
                    self.aborted = True
                    return
            if watch is not None:
                watch.scheduling()
            plan = policy.schedule()
            if plan is None:
                if watch is not None:
                    watch.planned(None, 0)
                now = inbox.next_time
                if now == inf:
                    return
                yield now
                continue
            stretch = self._stretch(plan, now)
            if watch is not None:
                watch.planned(plan, 0 if stretch is None else len(stretch[0]) - 1)
            if stretch is None:
                end = backend.run(plan, now)
                yield end
                finished = apply_iteration(policy, records, plan, now, end)
            else:
                ends, kv_used = stretch
                self.stretch = ends
                if (yield float(ends[-1])):  # resumed early: a request was pushed while it ran
                    ends = yield from self._cut(ends)
                self.stretch = None
                end = float(ends[-1])
                if inbox.pushed_while_serving:
                    # its KV is allocated now that it ran: a router never saw it ahead
                    extra = len(ends) - 1
                    if policy.extend(plan, extra) != extra:
                        raise RuntimeError(f"{policy.name}: extend() allowed fewer repeats than "
                                           "repeats_allowed()")
                if kv_used is not None:
                    kv_used = kv_used[:len(ends)]
                finished = apply_stretch(policy, records, plan, now, ends, kv_used)
            if watch is not None:
                watch.ran(plan, finished)
            if finished:
                backend.release(finished)
            now = end

    def _stretch(self, plan: BatchPlan, now: float) -> tuple[np.ndarray, list[int] | None] | None:
        """End times of the iterations this plan can run back to back (None: just one), and for a plan with
        prefill chunks the KV each of them holds (None for a decode-only plan, recorded as one row)."""
        if plan.decode_only:
            decodes, extra = plan.seqs, self.max_stretch - 1
        else:
            extra = self.policy.chunk_repeats(plan)
            if extra <= 0:
                return None
            decodes, extra = plan.seqs[:plan.decode_tokens], min(extra, self.max_stretch - 1)
        if decodes:  # until the first decode samples its last token
            extra = min(extra, min([s.output_tokens - s.generated for s in decodes]) - 1)
        if extra <= 0:
            return None
        durations = self.backend.stretch_times(plan, extra + 1)
        if durations is None:
            return None
        durations[0] += now  # the first repeat starts now: then sequential adds, as stepping does
        ends = durations.cumsum()
        # stop at the iteration that ends at or after the next arrival that matters: the policy decides again
        # after it
        due = self.inbox.next_time if plan.decode_only else self._arrival_that_stops(ends)
        extra = min(extra, int(ends.searchsorted(due, side="left")))
        if extra <= 0:
            return None
        kv_used = None if plan.decode_only else self.policy.kv.used_while_growing(decodes, extra + 1)
        if self.inbox.pushed_while_serving:  # how far KV allows; allocated once the stretch has run
            extra = self.policy.repeats_allowed(plan, extra)
        else:  # nothing can cut it: allocated now, in the same pass over the decodes that bounds it
            extra = self.policy.extend(plan, extra)
        if extra <= 0:
            return None
        return ends[:extra + 1], kv_used[:extra + 1] if kv_used is not None else None

    def _arrival_that_stops(self, ends: np.ndarray) -> float:
        """When a chunk stretch must stop for an arrival. Fresh requests only wait while it runs (its policy
        has no budget left to admit them: `chunk_repeats`) and are handed over when it ends, in order, seeing
        the same queue as stepping would; it stops for one that arrives with its KV (which may join the
        decodes), or for the one that makes the run give up (`max_waiting`)."""
        room = float("inf") if self.max_waiting is None else self.max_waiting - len(self.policy.waiting)
        for n, (due, seq) in enumerate(self.inbox.due_by(float(ends[-1]))):
            if not seq.in_prefill or n >= room:
                return due
        return float("inf")

    def _cut(self, ends: np.ndarray) -> Generator[float, None, np.ndarray]:
        """A request was pushed while a stretch ran (the driver resumed the loop at the push): stop at the
        iteration that ends at or after it, as a stretch priced with that request in the inbox would have, and
        wait for that iteration."""
        ends = ends[:int(np.searchsorted(ends, self.inbox.next_time, side="left")) + 1]
        self.stretch = ends  # what a later push is checked against: it cannot cut this one shorter
        yield float(ends[-1])
        return ends
