"""The waiting queue: sequences waiting to be admitted, in the policy's admission order.

A policy admits from its queue head first (or scans it in order), so the queue alone decides the order:
- `fcfs`: arrival order; a sequence preempted by recompute goes back first (vLLM's FCFS queue);
- `shortest`: fewest tokens to prefill first, then arrival (Prepacking's length-ordered batching);
- `priority`: highest `Seq.priority` first, then arrival (Baton's preemptive scheduling; vLLM's priority
  queue ranks the lowest value first). A preempted sequence goes back to its place in the order, as in
  vLLM's priority queue, which has no front to go back to.
"""

from __future__ import annotations

import bisect
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Iterator

from simctl.policies.seq import Seq

FCFS = "fcfs"
ADMISSION_ORDERS = (FCFS, "shortest", "priority")


class WaitingQueue(ABC):
    """What a policy does with its waiting sequences; iterating yields them in admission order.

    `prefill`: the prompt tokens its sequences have to compute (`Seq.queued_prefill`), kept as they enter and
    leave so that a router reading a replica's pending prefill (`kv-cost`) need not walk a backlog."""

    prefill: int = 0

    @abstractmethod
    def add(self, seq: Seq) -> None:
        """A new arrival."""

    @abstractmethod
    def requeue(self, seq: Seq) -> None:
        """A sequence preempted by recompute waits again."""

    @abstractmethod
    def head(self) -> Seq:
        """The next sequence to admit (IndexError when empty)."""

    @abstractmethod
    def take(self, seq: Seq) -> None:
        """Take `seq` off the queue to admit it: the head, or any other for a policy that picks (packing)."""

    @abstractmethod
    def remove(self, seq: Seq) -> None:
        """`seq` leaves without being admitted (handed to another instance)."""

    @abstractmethod
    def __iter__(self) -> Iterator[Seq]: ...

    @abstractmethod
    def __len__(self) -> int: ...  # also its truth value

    @abstractmethod
    def last_ranked(self, running: list[Seq]) -> Seq:
        """Of the running sequences (in the order they were admitted), the one to preempt first when KV runs
        out: the last admitted, but under priority the lowest priority, then the latest arrival (vLLM v1's
        FCFS and priority policies; shortest-first has no rule of its own)."""


class ArrivalOrder(deque[Seq], WaitingQueue):
    """FCFS: a deque (its `len` and iteration). A queue of sequences that arrived with their KV uses the
    deque's own `append` and `popleft` too: they count nothing to prefill."""

    def add(self, seq: Seq) -> None:
        self.append(seq)
        self.prefill += seq.queued_prefill

    def requeue(self, seq: Seq) -> None:
        self.appendleft(seq)
        self.prefill += seq.queued_prefill

    def head(self) -> Seq:
        return self[0]

    def take(self, seq: Seq) -> None:
        if self[0] is seq:
            self.popleft()
        else:
            deque.remove(self, seq)
        self.prefill -= seq.queued_prefill

    def remove(self, seq: Seq) -> None:
        deque.remove(self, seq)
        self.prefill -= seq.queued_prefill

    def last_ranked(self, running: list[Seq]) -> Seq:
        return running[-1]


class KeyOrder(WaitingQueue):
    """Sequences kept sorted by a rank that does not change while they wait (ties: arrival, then id)."""

    def __init__(self, rank: Callable[[Seq], tuple], preempt_by_rank: bool) -> None:
        self.rank = rank
        self.preempt_by_rank = preempt_by_rank
        self.seqs: list[Seq] = []

    def key(self, seq: Seq) -> tuple:
        return *self.rank(seq), seq.id

    def add(self, seq: Seq) -> None:
        bisect.insort(self.seqs, seq, key=self.key)
        self.prefill += seq.queued_prefill

    def requeue(self, seq: Seq) -> None:
        self.add(seq)

    def head(self) -> Seq:
        return self.seqs[0]

    def take(self, seq: Seq) -> None:
        self.remove(seq)

    def remove(self, seq: Seq) -> None:
        self.seqs.remove(seq)  # by identity: Seq has no __eq__
        self.prefill -= seq.queued_prefill

    def __iter__(self) -> Iterator[Seq]:
        return iter(self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)

    def last_ranked(self, running: list[Seq]) -> Seq:
        if not self.preempt_by_rank:
            return running[-1]
        return max(running, key=self.rank)  # ties: the first admitted, as vLLM's max() over its running list


def shortest_first(s: Seq) -> tuple[int, float]:
    return s.prefill_remaining, s.arrival_s


def highest_priority_first(s: Seq) -> tuple[int, float]:
    return -s.priority, s.arrival_s


def waiting_queue(order: str) -> WaitingQueue:
    """An empty queue of the given admission order (one of `ADMISSION_ORDERS`, checked by the settings)."""
    if order == FCFS:
        return ArrivalOrder()
    if order == "shortest":
        return KeyOrder(shortest_first, preempt_by_rank=False)
    return KeyOrder(highest_priority_first, preempt_by_rank=True)
