"""What every router sees and is (`serving.routers` is the registry): one `ReplicaView` per replica at a
request's arrival, the `Router` protocol, and the cache-aware routers' `RouterSettings`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from simctl.policies.seq import Seq


@dataclass(slots=True)  # not frozen: built for every replica at every arrival, and frozen init costs 2x
class ReplicaView:
    # routed here and not yet admitted (waiting, arrived with KV, or not yet taken from the inbox)
    queued: int
    outstanding: int  # routed here and not yet finished (or handed on to another pool)
    kv_used: int  # KV token slots held at this instant
    # prompt tokens still to prefill of the requests routed here (queued and running), counted only for a
    # router that reads it (`Router.reads_prefill`): the others skip the walk over the replica's requests
    prefill: int = 0


class Router(Protocol):
    """A replica's index for the request. A router that reads `ReplicaView.prefill` has an attribute
    `reads_prefill` set True (the pool reads it once, with getattr)."""

    def __call__(self, views: Sequence[ReplicaView], seq: Seq | None = None) -> int: ...


@dataclass(frozen=True)
class RouterSettings:
    """The cache-aware routers' settings (`--router-weights`, `--router-index-tokens`)."""

    # the prefix-cache, KV-utilisation and queue scorers' weights: llm-d's precise-prefix-cache path, 2:1:1
    weights: tuple[float, float, float] = (2.0, 1.0, 1.0)
    # prefix-approx's LRU index per replica, in tokens: llm-d's default lruCapacityPerServer, 31,250 blocks
    # of 64 tokens (gateway-api-inference-extension's prefix plugin)
    index_tokens: int = 31_250 * 64
