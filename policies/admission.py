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

from policies.seq import Seq

FCFS = "fcfs"
ADMISSION_ORDERS = (FCFS, "shortest", "priority")


class WaitingQueue(ABC):
    """What a policy does with its waiting sequences; iterating yields them in admission order."""

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


class ArrivalOrder(deque[Seq], WaitingQueue):
    """FCFS: a deque (its `remove`, `len` and iteration): the default costs what the policies' deque did."""

    def add(self, seq: Seq) -> None:
        self.append(seq)

    def requeue(self, seq: Seq) -> None:
        self.appendleft(seq)

    def head(self) -> Seq:
        return self[0]

    def take(self, seq: Seq) -> None:
        if self[0] is seq:
            self.popleft()
        else:
            self.remove(seq)


class KeyOrder(WaitingQueue):
    """Sequences kept sorted by a key that does not change while they wait (ties: arrival, then id)."""

    def __init__(self, key: Callable[[Seq], tuple]) -> None:
        self.key = key
        self.seqs: list[Seq] = []

    def add(self, seq: Seq) -> None:
        bisect.insort(self.seqs, seq, key=self.key)

    def requeue(self, seq: Seq) -> None:
        self.add(seq)

    def head(self) -> Seq:
        return self.seqs[0]

    def take(self, seq: Seq) -> None:
        self.remove(seq)

    def remove(self, seq: Seq) -> None:
        self.seqs.remove(seq)  # by identity: Seq has no __eq__

    def __iter__(self) -> Iterator[Seq]:
        return iter(self.seqs)

    def __len__(self) -> int:
        return len(self.seqs)


def shortest_first(s: Seq) -> tuple[int, float, int]:
    return s.prefill_remaining, s.arrival_s, s.id


def highest_priority_first(s: Seq) -> tuple[int, float, int]:
    return -s.priority, s.arrival_s, s.id


def waiting_queue(order: str) -> WaitingQueue:
    """An empty queue of the given admission order (one of `ADMISSION_ORDERS`, checked by the settings)."""
    if order == FCFS:
        return ArrivalOrder()
    return KeyOrder(shortest_first if order == "shortest" else highest_priority_first)
