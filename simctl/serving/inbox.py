"""Where requests reach a replica: an arrival process or a router pushes them, the replica drains those
due."""

from __future__ import annotations

from collections.abc import Iterator

from simctl.policies.seq import Seq


class Inbox:
    """Requests pushed to one replica, in non-decreasing arrival and due time (a request may be pushed ahead
    of its arrival: a trace replayed as given is pushed whole at the start). A request is due at its arrival,
    or when the cluster says (a simulated front end's, `serving.front_end`; a real engine's front end takes
    its own time). `next_time` is when the next one is due, which is where the replica cuts a decode
    stretch."""

    __slots__ = ("_dues", "_next", "_seqs")
    # Whether requests may be pushed while the replica serves (a router's inbox), so that a push can cut a
    # stretch; this one is filled before serving (a trace, ahead of its arrival times).
    pushed_while_serving = False

    def __init__(self, seqs: list[Seq] | None = None, dues: list[float] | None = None) -> None:
        self._seqs: list[Seq] = []
        self._dues: list[float] = []
        self._next = 0
        for i, s in enumerate(seqs or ()):
            self.push(s, s.arrival_s if dues is None else dues[i])

    def push(self, seq: Seq, due: float | None = None) -> None:
        due = seq.arrival_s if due is None else due
        if self._seqs and (seq.arrival_s < self._seqs[-1].arrival_s or due < self._dues[-1]):
            raise ValueError(f"request {seq.id} pushed out of arrival order")
        self._seqs.append(seq)
        self._dues.append(due)

    @property
    def next_time(self) -> float:
        if self._next == len(self._seqs):
            return float("inf")
        return self._dues[self._next]

    def due_by(self, until: float) -> Iterator[tuple[float, Seq]]:
        """(due time, request) of those not yet handed over that are due by `until`, in order (nothing is
        taken)."""
        seqs, dues = self._seqs, self._dues
        for i in range(self._next, len(seqs)):
            if dues[i] > until:
                return
            yield dues[i], seqs[i]

    def pop_due(self, now: float) -> list[Seq]:
        start = self._next
        dues = self._dues
        while self._next < len(dues) and dues[self._next] <= now:
            self._next += 1
        return self._seqs[start:self._next]
