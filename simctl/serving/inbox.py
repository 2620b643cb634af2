"""Where requests reach a replica: an arrival process or a router pushes them, the replica drains those
due."""

from __future__ import annotations

from collections.abc import Iterator

from simctl.policies.seq import Seq


class Inbox:
    """Requests pushed to one replica, in non-decreasing arrival time (a request may be pushed ahead of its
    arrival: a trace replayed as given is pushed whole at the start). A request is due `delay_s` after it
    arrives (a simulated front end's admission latency, `CostModel.admission_s`; 0 for a real engine, whose
    front end takes its own time). `next_time` is when the next one is due, which is where the replica cuts a
    decode stretch."""

    __slots__ = ("_delay", "_next", "_seqs")
    # Whether requests may be pushed while the replica serves (a router's inbox), so that a push can cut a
    # stretch; this one is filled before serving (a trace, ahead of its arrival times).
    pushed_while_serving = False

    def __init__(self, seqs: list[Seq] | None = None, delay_s: float = 0.0) -> None:
        self._seqs: list[Seq] = []
        self._next = 0
        self._delay = delay_s
        for s in seqs or ():
            self.push(s)

    def push(self, seq: Seq) -> None:
        if self._seqs and seq.arrival_s < self._seqs[-1].arrival_s:
            raise ValueError(f"request {seq.id} pushed out of arrival order")
        self._seqs.append(seq)

    @property
    def next_time(self) -> float:
        if self._next == len(self._seqs):
            return float("inf")
        return self._seqs[self._next].arrival_s + self._delay

    def due_by(self, until: float) -> Iterator[tuple[float, Seq]]:
        """(due time, request) of those not yet handed over that are due by `until`, in order (nothing is
        taken)."""
        seqs, delay = self._seqs, self._delay
        for i in range(self._next, len(seqs)):
            due = seqs[i].arrival_s + delay
            if due > until:
                return
            yield due, seqs[i]

    def pop_due(self, now: float) -> list[Seq]:
        start = self._next
        seqs, delay = self._seqs, self._delay
        while self._next < len(seqs) and seqs[self._next].arrival_s + delay <= now:  # as next_time sums
            self._next += 1
        return seqs[start:self._next]
