"""The clients that send a workload's requests: when each is sent, written once for the simulated cluster and
the real engines (pure bookkeeping; the caller makes time pass and calls back at the instants it names).

A request is *ready* at its own arrival time, or, as a session's later turn (`Request.previous`), `think_s`
after the turn before it completed. Open loop, a ready request is sent at once. Closed loop (`concurrency`
N, vLLM bench's `--max-concurrency`): at most N requests are in flight; a ready request waits, in the order
requests became ready, for a client, and a client is free again `think_s` (the workload's think time) after
its request completed. A request's `arrival_s` in the records is when it was sent, as `vllm bench serve`
times a request from when it acquired its slot.

    clients = Clients(requests, concurrency=8, think_s=0.0)
    for r in clients.first():        at r.arrival_s: send clients.ready(r)  (None: it waits for a client)
    on completion of request i at t: for when, send in clients.completed(i, t):
                                         at when: send send()               (None: nothing to send)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Sequence

from simctl.traces.request import Request

Send = Callable[[], Request | None]  # called at its instant: the request sent then, or None


class Clients:
    """Which request is sent when; `in_flight` never exceeds `concurrency` (None: open loop, no bound)."""

    def __init__(self, requests: Sequence[Request], concurrency: int | None = None,
                 think_s: float = 0.0) -> None:
        self.concurrency = concurrency
        self.think_s = think_s
        self._requests = requests
        self._follower = {r.previous: r for r in requests if r.previous >= 0}  # turn -> the turn after it
        self.idle = concurrency  # clients free now (None: unbounded)
        self.waiting: deque[Request] = deque()  # ready, waiting for a client
        self.in_flight = 0

    @property
    def closed_loop(self) -> bool:
        """Whether a send depends on a completion (a client bound, or sessions' later turns): the caller
        cannot know every arrival ahead."""
        return self.concurrency is not None or bool(self._follower)

    def first(self) -> list[Request]:
        """The requests ready at their own arrival time (not following another turn), in arrival order."""
        return [r for r in self._requests if r.previous < 0]

    def ready(self, request: Request) -> Request | None:
        """`request` is ready now: it is sent now (returned) if a client is free, else it waits (None)."""
        if self.idle == 0:
            self.waiting.append(request)
            return None
        return self._send(request)

    def completed(self, request_id: int, now: float) -> list[tuple[float, Send]]:
        """Request `request_id` completed at `now`: the instants at which that may send a request, in order
        (a tie keeps it), each with what to call then, which returns the request sent or None: the session's
        next turn, ready its think time later, and the request's client, free the workload's think time
        later (closed loop only)."""
        self.in_flight -= 1
        due: list[tuple[float, Send]] = []
        turn = self._follower.pop(request_id, None)
        if turn is not None:
            due.append((now + turn.think_s, lambda: self.ready(turn)))
        if self.concurrency is not None:
            due.append((now + self.think_s, self.free))
        return due

    def free(self) -> Request | None:
        """A client is free now: it sends the request that has waited longest (returned), or idles (None)."""
        assert self.idle is not None, "free() in open loop"
        self.idle += 1
        return self._send(self.waiting.popleft()) if self.waiting else None

    def _send(self, request: Request) -> Request:
        if self.idle is not None:
            self.idle -= 1
        self.in_flight += 1
        return request
