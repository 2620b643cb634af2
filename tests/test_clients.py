"""Who sends what when (`simctl.serving.clients.Clients`), by hand: open loop, a client bound with and without
think time, and a session's turns."""

from __future__ import annotations

from simctl.serving.clients import Clients
from simctl.traces.request import Request


def _r(i: int, arrival: float = 0.0, previous: int = -1, think: float = 0.0) -> Request:
    return Request(i, arrival, 10, 5, previous=previous, think_s=think)


def test_open_loop_sends_every_ready_request_at_once() -> None:
    c = Clients([_r(0), _r(1, 1.0)])
    assert not c.closed_loop
    assert [c.ready(r) for r in c.first()] == [_r(0), _r(1, 1.0)]
    assert c.completed(0, 3.0) == []
    assert c.in_flight == 1


def test_a_bound_of_two_queues_the_third_until_a_client_is_free_after_its_think_time() -> None:
    reqs = [_r(i) for i in range(3)]
    c = Clients(reqs, concurrency=2, think_s=0.5)
    assert c.closed_loop
    assert [c.ready(r) for r in c.first()] == [reqs[0], reqs[1], None]
    assert c.in_flight == 2
    (when, send), = c.completed(1, 4.0)
    assert when == 4.5  # its client is free half a second later
    assert send() is reqs[2]
    assert c.in_flight == 2
    (when, send), = c.completed(0, 5.0)
    assert when == 5.5
    assert send() is None and c.idle == 1


def test_a_later_turn_is_ready_its_think_time_after_the_turn_before_it() -> None:
    first, second = _r(0, 2.0), _r(1, 2.0, previous=0, think=3.0)
    c = Clients([first, second])
    assert c.closed_loop and c.first() == [first]
    c.ready(first)
    (when, send), = c.completed(0, 7.0)
    assert when == 10.0
    assert send() is second
