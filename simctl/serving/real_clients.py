"""Closed-loop clients in real time (the simulator's are `sim.cluster.ClosedLoop`): each request is pushed to
the engine's inbox when `serving.clients.Clients` says it is sent, its `arrival_s` the clock's reading then,
so that it is timed from its send as `vllm bench serve` times it.

One thread does it all: the engine's loop tells `completed` of each request that completes (its backend's
release), which sends at once what is due then (no think time) and keeps the later instants in a heap;
`drive` runs the loop, and while the loop waits for work it sleeps until the next instant in the heap and
sends what is due. The run ends when the loop waits for work and nothing is left to send.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable, Generator

from simctl.policies.seq import Seq
from simctl.serving.clients import Clients
from simctl.serving.realtime import RealTime
from simctl.serving.routed import HELD, RoutedInbox
from simctl.traces.request import Request


class RealClients:
    """The sends of one real run into `inbox` (`RoutedInbox`: a request is pushed when sent)."""

    def __init__(self, clients: Clients, seqs: list[Seq], inbox: RoutedInbox, time: RealTime) -> None:
        self.clients, self.inbox, self.time = clients, inbox, time
        self._seqs = {s.id: s for s in seqs}
        # (when, order, what to do): a first turn's or later turn's readiness, or a client's freedom
        self._due: list[tuple[float, int, Callable[[], Request | None]]] = []
        self._order = itertools.count()  # ties in the order they were scheduled
        for r in clients.first():
            self._at(r.arrival_s, lambda r=r: self.clients.ready(r))

    def _at(self, when: float, action: Callable[[], Request | None]) -> None:
        heapq.heappush(self._due, (when, next(self._order), action))

    def completed(self, finished: list[Seq]) -> None:
        """The engine's release: each finished request's session turn and client are due later, or now."""
        for seq in finished:
            for when, send in self.clients.completed(seq.id, seq.completion_s):
                self._at(when, send)
        self._send_due()

    def _send_due(self) -> bool:
        """Send what is due by now; whether anything was sent."""
        sent = False
        while self._due and self._due[0][0] <= self.time.read():
            request = heapq.heappop(self._due)[2]()
            if request is not None:
                now = self.time.read()
                seq = self._seqs[request.id]
                seq.arrival_s = now
                self.inbox.push_due(seq, now)
                sent = True
        return sent

    def drive(self, loop: Generator[float, None, None]) -> None:
        """Run the engine's loop in real time: an iteration's end has passed when it is yielded; a wait for
        work sleeps until the next send (none left: the run is over)."""
        for until in loop:
            if until < HELD:  # an iteration's end (already reached), or a request pushed and due
                delay = until - self.time.read()
                if delay > 0:
                    self.time.sleep(delay)
                continue
            while not self._send_due():
                if not self._due:
                    return
                delay = self._due[0][0] - self.time.read()
                if delay > 0:
                    self.time.sleep(delay)
