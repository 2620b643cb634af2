"""The contract between a scheduling policy and whatever executes its plans (simulator or real engine).

The driver's loop, identical in `sim/` and in the real engine:

    policy.add(seq)                      # for every arrival, in arrival order
    plan = policy.schedule()             # None: nothing can run until something arrives
    extra = policy.extend(plan, limit)   # optional: repeat a decode-only plan `extra` more times
    ... execute; advance each seq by its new tokens (Seq.advance) ...
    policy.finish(seq)                   # for every sequence that sampled its last output token

A policy owns its queues and its KV manager; it never reads a clock and never touches SimPy or torch.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from typing import ClassVar

from policies.kv import KVManager
from policies.plan import BatchPlan
from policies.seq import Phase, Seq


class Policy(ABC):
    name: ClassVar[str]
    summary: ClassVar[str]  # one line for `simctl list`

    def __init__(self, kv: KVManager, max_batch_size: int) -> None:
        if max_batch_size < 1:
            raise ValueError("max_batch_size must be at least 1")
        self.kv = kv
        self.max_batch_size = max_batch_size
        self.waiting: deque[Seq] = deque()
        self.running: list[Seq] = []  # admitted, oldest first

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    @property
    def idle(self) -> bool:
        return not self.waiting and not self.running

    @abstractmethod
    def schedule(self) -> BatchPlan | None:
        """Decide the next iteration, allocating the KV it needs."""

    def extend(self, plan: BatchPlan, limit: int) -> int:
        """Allow a decode-only plan to repeat up to `limit` more times, allocating KV for it.

        Valid only while nothing arrives or finishes: the policy would then schedule the very same batch
        again (its waiting queue stays blocked and KV only gets scarcer). Returns how many extra repeats the
        KV allows; the default suits policies whose only repeat-breaking event is KV running out.
        """
        return max(self.kv.grow_common(plan.seqs, limit + 1) - 1, 0)

    def finish(self, seq: Seq) -> None:
        """The sequence sampled its last token: release it."""
        seq.phase = Phase.FINISHED
        self.running.remove(seq)
        self.kv.free(seq)

    # --- helpers shared by the iteration-level policies ---

    def _admit(self, seq: Seq) -> None:
        self.waiting.popleft()
        self.kv.admit(seq)
        seq.phase = Phase.RUNNING
        self.running.append(seq)

    def _preempt(self, victim: Seq) -> None:
        """Preemption by recompute (vLLM's default for single-sequence requests): drop the KV, requeue first."""
        self.running.remove(victim)
        self.kv.free(victim)
        victim.reset_for_recompute()
        self.waiting.appendleft(victim)

    def _grow_decodes(self) -> list[Seq]:
        """Reserve one more KV slot for every running decode, oldest first; when memory runs out, preempt the
        newest running request (possibly the one asking) until the slot fits. Returns the decodes to run."""
        decodes = [s for s in self.running if s.computed >= s.prefill_end]
        if self.kv.grow_each(decodes):  # the common case: memory suffices, nobody is preempted
            return decodes
        decodes = []
        queue = list(self.running)
        i = 0
        while i < len(queue):
            s = queue[i]
            if s.in_prefill:
                i += 1
                continue
            while not self.kv.can_grow(s):
                victim = queue.pop()
                self._preempt(victim)
                if victim is s:
                    break
            else:
                self.kv.grow(s)
                decodes.append(s)
                i += 1
        return decodes
