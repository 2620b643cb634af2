"""Routers: which replica of a pool gets a request, decided at the instant it arrives.

A router sees one `ReplicaView` per replica, built at that instant from what exists then (requests queued and
outstanding, KV held), never from what a replica will do later (a decode stretch in progress allocates its
later iterations' KV only when they are applied), and the request itself. Routers are pure decision logic:
no clock, no SimPy. Ties on the queue or the KV go to the replica with fewer outstanding requests (empty
queues are the common case: a plain lowest-index tie-break piled requests onto replica 0), then to the lowest
index, so the same trace and seed route the same way. The cache-aware routers (`serving.cache_routers`) also
read the replicas' prefix caches, which the pool hands them when it is built.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from simctl.common.errors import InputError
from simctl.serving.router_base import ReplicaView, Router, RouterSettings

if TYPE_CHECKING:
    from simctl.policies.kv import KVManager
    from simctl.policies.seq import Seq

__all__ = ["ROUTERS", "ReplicaView", "RoundRobin", "Router", "RouterSettings", "check_router", "make_router"]


class RoundRobin:
    """Replica 0, 1, ..., N-1, 0, ...: spreads requests evenly whatever their sizes."""

    def __init__(self) -> None:
        self._next = 0

    def __call__(self, views: Sequence[ReplicaView], seq: Seq | None = None) -> int:
        i = self._next % len(views)
        self._next = i + 1
        return i


def least(key: Callable[[ReplicaView], object]) -> Router:
    def choose(views: Sequence[ReplicaView], seq: Seq | None = None) -> int:
        return min(range(len(views)), key=lambda i: key(views[i]))  # min keeps the first of equals
    return choose


def _in_cache_routers(name: str) -> Callable[[Sequence[KVManager], RouterSettings], Router]:
    def build(caches: Sequence[KVManager], settings: RouterSettings) -> Router:
        from simctl.serving import cache_routers  # the registry stays light; these need the KV managers

        return cache_routers.build(name, caches, settings)
    return build


def _plain(make: Callable[[], Router]) -> Callable[[Sequence[KVManager], RouterSettings], Router]:
    return lambda caches, settings: make()


# name -> (builder from the replicas' KV managers and the settings, where it comes from)
ROUTERS: dict[str, tuple[Callable[[Sequence[KVManager], RouterSettings], Router], str]] = {
    "round-robin": (_plain(RoundRobin), "replica 0, 1, ..."),
    "least-outstanding": (_plain(lambda: least(lambda v: v.outstanding)), "fewest requests in flight"),
    "least-kv": (_plain(lambda: least(lambda v: (v.kv_used, v.outstanding))), "least KV held"),
    "shortest-queue": (_plain(lambda: least(lambda v: (v.queued, v.outstanding))), "fewest waiting"),
    "random": (_in_cache_routers("random"), "uniform, seeded: llm-d's random picker"),
    "load": (_in_cache_routers("load"), "llm-d's KV-utilisation and queue scorers, 1:1"),
    "prefix": (_in_cache_routers("prefix"), "llm-d's precise prefix-cache, KV-utilisation and queue scorers"),
    "prefix-approx": (_in_cache_routers("prefix-approx"),
                      ("the same, its prefix score from its own LRU of what it sent where: llm-d's "
                       "approximate scorer, SGLang's router")),
    "kv-cost": (_in_cache_routers("kv-cost"),
                ("the least cost, prefill tokens left there plus the prompt less its cached overlap, over "
                 "the block size, plus the blocks held there and the request's others: Dynamo's KV router")),
    "session": (_in_cache_routers("session"),
                "a session's turns to one replica until it saturates: SGLang's balance thresholds"),
}


def check_router(name: str) -> None:
    if name not in ROUTERS:
        raise InputError(f"unknown --router {name!r}; known: {', '.join(ROUTERS)}")


def make_router(name: str, caches: Sequence[KVManager] = (),
                settings: RouterSettings | None = None) -> Router:
    """A fresh router (round-robin keeps its position, so each pool gets its own); `caches`: the pool's
    replicas' KV managers, in replica order (read by the cache-aware routers only)."""
    check_router(name)
    return ROUTERS[name][0](caches, settings or RouterSettings())
