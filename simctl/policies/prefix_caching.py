"""Automatic prefix caching for a policy with its own scheduling (`sarathi`, `vllm`):
`--enable-prefix-caching 1` gives it vLLM v1's block pool (`simctl.policies.prefix_kv.PrefixCachingKV`,
blocks of 16 tokens, no watermark) in place of its paged KV, and its admissions start from their prefix-cache
hits, as vllm-v1's do.

What the policy keeps: its order, its batches and its token budget. What changes with caching on: a request
is admitted when its whole known sequence fits next to its hits (vLLM v1's gate), its `computed` starts at
its hits (full blocks, never the last token), the blocks of its whole pending prefill are set aside at
admission (as the paged KV did) and each block gets its hash when the step that computes it is scheduled
(`_scheduled`), so a request admitted later in the same step already finds it, as in vLLM v1. A policy that
repeats chunks without a schedule (sarathi's `chunk_repeats`) does not while caching, so that every chunk is
scheduled, hashes and all. Off (the default), nothing differs from the policy without this class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simctl.policies.base import Policy, Settings, option
from simctl.policies.kv import KVManager
from simctl.policies.prefix_kv import PrefixCachingKV
from simctl.policies.seq import Seq
from simctl.policies.vllm_v1 import VLLMV1

BLOCK_SIZE = 16  # vLLM's default block size on a GPU (vllm/config/cache.py: DEFAULT_BLOCK_SIZE)


@dataclass(frozen=True)
class CachingSettings(Settings):
    enable_prefix_caching: int = option(0, "1: automatic prefix caching, vLLM v1's block pool (sarathi and "
                                           "vllm: blocks of 16, no watermark), 0: off", minimum=0, maximum=1)

    def as_dict(self) -> dict[str, Any]:
        """Caching off goes unsaid, as in the summaries written before the setting."""
        out = super().as_dict()
        if not out["enable_prefix_caching"]:
            del out["enable_prefix_caching"]
        return out


class CachesPrefixes(Policy):
    """A policy that may cache prefixes: its schedule calls `_hit` on a waiting request before sizing its
    chunk and `_scheduled` for every prefill chunk it schedules; both do nothing with caching off."""

    Settings = CachingSettings

    def __init__(self, kv: KVManager, **options: Any) -> None:
        super().__init__(kv, **options)
        self.cache = kv if isinstance(kv, PrefixCachingKV) else None
        self.queries = self.hits = self.preempted_queries = self.preempted_hits = 0

    @classmethod
    def build(cls, kv_capacity_tokens: int, max_seq_len: int, options: Mapping[str, Any],
              gpu: str | None = None) -> Policy:
        given = {k: v for k, v in options.items() if v is not None}
        if not given.get("enable_prefix_caching"):
            return super().build(kv_capacity_tokens, max_seq_len, options, gpu)
        return cls(PrefixCachingKV(kv_capacity_tokens, BLOCK_SIZE, caching=True), **given)

    @property
    def shares_prefixes(self) -> bool:
        return self.cache is not None

    # vLLM's prefix-cache counters, counted and reported as vllm-v1 does
    stats = VLLMV1.stats
    summarise_stats = VLLMV1.__dict__["summarise_stats"]
    _count = VLLMV1._count

    def _hit(self, seq: Seq) -> None:
        """The head of the queue, about to be admitted, starts from its prefix-cache hits: its pending prefill
        is what the cache lacks. If it is not admitted after all, `_unhit` it."""
        if self.cache is not None:
            seq.computed = len(self.cache.lookup(seq)) * self.cache.block_size

    def _unhit(self, seq: Seq) -> None:
        """The head stays waiting: nothing computed until it is admitted (a queue kept in order of pending
        prefill relies on it, and its hits may change meanwhile)."""
        if self.cache is not None:
            seq.computed = 0

    def _admit(self, seq: Seq) -> None:
        super()._admit(seq)
        if self.cache is not None:
            self._count(seq, seq.computed)
            self.cache.reserve(seq)

    def _scheduled(self, seq: Seq, tokens: int) -> None:
        """The step computes the request's tokens up to `tokens`: its blocks full by then get their hash."""
        if self.cache is not None:
            self.cache.allocate(seq, tokens)

