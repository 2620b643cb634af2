"""Routers: which replica of a pool gets a request, decided at the instant it arrives.

A router sees one `ReplicaView` per replica, built at that instant from what exists then (requests queued and
outstanding, KV held), never from what a replica will do later (a decode stretch in progress allocates its
later iterations' KV only when they are applied). Routers are pure decision logic: no clock, no SimPy. Ties on
the queue or the KV go to the replica with fewer outstanding requests (empty queues are the common case: a
plain lowest-index tie-break piled requests onto replica 0), then to the lowest index, so the same trace and
seed route the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from simctl.common.errors import InputError


@dataclass(slots=True)  # not frozen: built for every replica at every arrival, and frozen init costs 2x
class ReplicaView:
    # routed here and not yet admitted (waiting, arrived with KV, or not yet taken from the inbox)
    queued: int
    outstanding: int  # routed here and not yet finished (or handed on to another pool)
    kv_used: int  # KV token slots held at this instant


class RoundRobin:
    """Replica 0, 1, ..., N-1, 0, ...: spreads requests evenly whatever their sizes."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, views: Sequence[ReplicaView]) -> int:
        i = self._next % len(views)
        self._next = i + 1
        return i


def _least(key: Callable[[ReplicaView], object]) -> Callable[[Sequence[ReplicaView]], int]:
    def choose(views: Sequence[ReplicaView]) -> int:
        return min(range(len(views)), key=lambda i: key(views[i]))  # min keeps the first of equals
    return choose


Router = Callable[[Sequence[ReplicaView]], int]

ROUTERS: dict[str, Callable[[], Router]] = {
    "round-robin": RoundRobin,
    "least-outstanding": lambda: _least(lambda v: v.outstanding),
    "least-kv": lambda: _least(lambda v: (v.kv_used, v.outstanding)),
    "shortest-queue": lambda: _least(lambda v: (v.queued, v.outstanding)),
}


def check_router(name: str) -> None:
    if name not in ROUTERS:
        raise InputError(f"unknown --router {name!r}; known: {', '.join(ROUTERS)}")


def make_router(name: str) -> Router:
    """A fresh router (round-robin keeps its position, so each pool gets its own)."""
    check_router(name)
    return ROUTERS[name]()
