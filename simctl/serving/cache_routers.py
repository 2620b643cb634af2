"""Routers that read where a request's prefix is cached, and the sticky session router.

`prefix` is llm-d's precise prefix-cache-aware scheduling (llm-d-inference-scheduler, the `precise-prefix-
cache-scorer` with the `kv-cache-utilization-scorer`, `queue-scorer` and `max-score-picker`): each replica
scores w_p * prefix + w_k * (1 - KV used / KV capacity) + w_q * queue, the highest wins. Its prefix score
counts the request's first blocks found in the replica's actual cache (llm-d reads vLLM's KV events; here
the replica's `PrefixCachingKV`, the hit a lookup would get now), min-max normalised over the replicas that
hold any (`indexedScoresToNormalizedScoredPods`: equal counts score 1, replicas holding none 0). The queue
score is (max - queued) / (max - min) over the replicas (1 when all are equal), as the gateway API inference
extension's queue scorer.

`prefix-approx` is llm-d's approximate mode (the inference extension's `prefix-cache-scorer`, SGLang's
router likewise): the router never sees a cache, only its own per-replica LRU index of the blocks it sent
there (`RouterSettings.index_tokens` of them), so evictions go unseen; its prefix score is the share of the
request's blocks matched (matched / total). Same scorers and weights otherwise.

`session` keeps a session's turns on the replica its first turn went to (the least outstanding) until that
replica saturates, which we define as SGLang's router defines an imbalance (`balance_abs_threshold` 64,
`balance_rel_threshold` 1.5): it has more than 64 requests outstanding above the least loaded replica and
over 1.5 times its count. Then the turn, and the session from then on, goes to the least outstanding.
Requests without a session go to the least outstanding.

`kv-cost` is Dynamo's KV router (ai-dynamo/dynamo, docs/design_docs/router_design.md "Cost Calculation";
lib/llm/src/kv_router/scheduler.rs, `DefaultWorkerSelector`; sequence.rs, `potential_blocks_and_tokens`): the
lowest cost wins, in blocks, cost = w * prefill tokens / block size + decode blocks with w its
`overlap_score_weight`, 1 by default. Prefill tokens: the replica's not yet prefilled plus the request's
prompt less its overlap (its blocks cached there, as `prefix` reads them) times the block size, at least 0.
Decode blocks: the blocks the replica's requests hold plus the request's blocks not held there. Dynamo's
router tracks the first term itself: each routed request's prompt less its overlap at routing, until its
first token (lib/llm/src/kv_router/sequence.rs, `add_request`, `mark_prefill_completed`). The twin reads
the replica (`ReplicaView.prefill`): a queued request counts its prompt less the overlap this router found
when it sent it there (it leaves it on the request, `Seq.routed_overlap`), a running one what its prefill
has left (after its actual hits and the chunks computed), a preempted one its whole recompute.

`load` is llm-d's load-aware profile (the KV-utilisation and queue scorers, 1:1), `random` its random picker
(seeded).

Ties go to fewer outstanding requests, then the lower index (llm-d's picker breaks them at random).
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Sequence

from simctl.common.errors import InputError
from simctl.policies.kv import KVManager
from simctl.policies.prefix_kv import Key, PrefixCachingKV, leading
from simctl.policies.seq import Seq
from simctl.serving.router_base import ReplicaView, Router, RouterSettings

SATURATION_ABS = 64  # SGLang router's balance_abs_threshold default
SATURATION_REL = 1.5  # its balance_rel_threshold default


class Scored:
    """llm-d's scheduling profile: weighted prefix, KV-utilisation and queue scorers, the max score wins.
    Subclasses give the prefix score (`prefix_scores`) and learn where a request went (`routed`)."""

    def __init__(self, caches: Sequence[KVManager], weights: tuple[float, float, float]) -> None:
        self.capacity = [kv.capacity for kv in caches]
        self.weights = weights

    def keys(self, seq: Seq | None) -> list[Key]:
        """The request's block keys the prefix score matches (none: no prefix score)."""
        return []

    def prefix_scores(self, keys: list[Key]) -> list[float]:
        return [0.0] * len(self.capacity)

    def routed(self, replica: int, keys: list[Key]) -> None:
        """The request with these block keys went to `replica`."""

    def __call__(self, views: Sequence[ReplicaView], seq: Seq | None = None) -> int:
        wp, wk, wq = self.weights
        keys = self.keys(seq) if wp else []  # the same on every replica: computed once, and only if wanted
        prefix = self.prefix_scores(keys) if wp else None
        queued = [v.queued for v in views]
        lo, hi = min(queued), max(queued)
        best, best_key = 0, (0.0, 0)
        for i, v in enumerate(views):
            score = wk * (1.0 - v.kv_used / self.capacity[i]) + wq * (
                1.0 if hi == lo else (hi - v.queued) / (hi - lo))
            if prefix is not None:
                score += wp * prefix[i]
            key = (-score, v.outstanding)
            if i == 0 or key < best_key:
                best, best_key = i, key
        self.routed(best, keys)
        return best


class Prefix(Scored):
    """Scored with a prefix score over the request's block keys, as the replicas' prefix caches key them."""

    def __init__(self, caches: Sequence[PrefixCachingKV], settings: RouterSettings) -> None:
        super().__init__(caches, settings.weights)
        self.caches = caches

    def keys(self, seq: Seq | None) -> list[Key]:
        assert seq is not None, "a prefix router needs the request"
        return list(self.caches[0].block_keys(seq))  # every replica keys blocks alike


class Precise(Prefix):
    """The prefix score from each replica's actual cache: its cached run of the request's blocks, min-max
    normalised over the replicas holding any."""

    def prefix_scores(self, keys: list[Key]) -> list[float]:
        counts = [kv.cached_run(keys) for kv in self.caches]
        held = [c for c in counts if c]
        if not held:
            return [0.0] * len(counts)
        lo, hi = min(held), max(held)
        return [0.0 if not c else 1.0 if hi == lo else (c - lo) / (hi - lo) for c in counts]


class Approximate(Prefix):
    """The prefix score from the router's own LRU index per replica of the blocks it sent there."""

    def __init__(self, caches: Sequence[PrefixCachingKV], settings: RouterSettings) -> None:
        super().__init__(caches, settings)
        self.index: list[OrderedDict[Key, None]] = [OrderedDict() for _ in caches]
        self.blocks = max(1, settings.index_tokens // caches[0].block_size)

    def prefix_scores(self, keys: list[Key]) -> list[float]:
        if not keys:
            return [0.0] * len(self.index)
        return [leading(keys, index) / len(keys) for index in self.index]

    def routed(self, replica: int, keys: list[Key]) -> None:
        index = self.index[replica]
        for k in keys:
            index[k] = None
            index.move_to_end(k)
        while len(index) > self.blocks:
            index.popitem(last=False)


class Sticky:
    """A session's turns to one replica until it saturates (the module's docstring)."""

    def __init__(self) -> None:
        self.home: dict[int, int] = {}  # session -> its replica

    def __call__(self, views: Sequence[ReplicaView], seq: Seq | None = None) -> int:
        least = min(range(len(views)), key=lambda i: views[i].outstanding)
        if seq is None or seq.session < 0:
            return least
        home = self.home.get(seq.session)
        if home is not None and not saturated(views[home].outstanding, views[least].outstanding):
            return home
        self.home[seq.session] = least
        return least


def saturated(load: int, least: int) -> bool:
    return load - least > SATURATION_ABS and load > SATURATION_REL * least


class Random:
    """Uniformly at random (llm-d's random-picker), from a fixed seed so that a run repeats."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def __call__(self, views: Sequence[ReplicaView], seq: Seq | None = None) -> int:
        return self.rng.randrange(len(views))


class KVCost(Prefix):
    """Dynamo's KV router cost (the module's docstring): the least cost wins."""

    reads_prefill = True
    OVERLAP_WEIGHT = 1.0  # Dynamo's --kv-overlap-score-weight default

    def __call__(self, views: Sequence[ReplicaView], seq: Seq | None = None) -> int:
        assert seq is not None, "kv-cost needs the request"
        keys = self.keys(seq)
        prompt, bs = seq.prefill_end - seq.computed, self.caches[0].block_size
        best, best_key, best_overlap = 0, (0.0, 0), 0
        for i, (v, kv) in enumerate(zip(views, self.caches)):
            overlap, held = kv.cached_run_held(keys)
            prefill = v.prefill + max(prompt - overlap * bs, 0)
            cost = self.OVERLAP_WEIGHT * prefill / bs + v.kv_used // bs + len(keys) - held
            key = (cost, v.outstanding)
            if i == 0 or key < best_key:
                best, best_key, best_overlap = i, key, overlap
        seq.routed_overlap = min(best_overlap * bs, prompt)  # what that replica's queue counts off it
        return best


def build(name: str, caches: Sequence[KVManager], settings: RouterSettings) -> Router:
    if name == "session":
        return Sticky()
    if name == "random":
        return Random()
    if name == "load":  # llm-d's load-aware profile: the KV and queue scorers alone, 1:1
        return Scored(caches, (0.0, 1.0, 1.0))
    if not caches or not all(isinstance(kv, PrefixCachingKV) and kv.caching for kv in caches):
        raise InputError(f"--router {name} routes by the replicas' prefix caches: it needs a policy with "
                         "prefix caching on (vllm-v1)")
    prefix_caches = [kv for kv in caches if isinstance(kv, PrefixCachingKV)]
    kind = {"prefix": Precise, "prefix-approx": Approximate, "kv-cost": KVCost}[name]
    return kind(prefix_caches, settings)
