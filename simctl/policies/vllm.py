"""vLLM (v0 default scheduler): iteration-level, prefill-prioritizing, paged KV (Sarathi-Serve, Algorithm 2).

An iteration is all-prefill or all-decode. First admit waiting requests in arrival order while their whole
prompt's blocks fit above the watermark, the batch has room and the prompts fit the token limit; if any were
admitted, run their prefills alone (the running decodes stall: a generation stall). Otherwise run one decode
token of every running request, preempting the newest one by recompute whenever a block is missing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simctl.policies.base import Policy, option
from simctl.policies.kv import KVManager
from simctl.policies.plan import BatchPlan, hybrid
from simctl.policies.prefix_caching import CachesPrefixes, CachingSettings


class VLLM(CachesPrefixes):
    name = "vllm"
    summary = "iteration-level, prefill-first, all-prefill or all-decode iterations, paged KV, preemption"

    @dataclass(frozen=True)
    class Settings(CachingSettings):
        max_tokens: int | None = option(None, "prompt tokens per prefill iteration (max_num_batched_tokens; "
                                              "default: the max sequence length)")

    def __init__(self, kv: KVManager, **options: int) -> None:
        super().__init__(kv, **options)
        if self.settings.max_tokens is None:
            raise ValueError("vLLM needs max_tokens: build() sets it to the deployment's max sequence length")
        self.max_tokens = self.settings.max_tokens

    @classmethod
    def build(cls, kv_capacity_tokens: int, max_seq_len: int, options: Mapping[str, Any],
              gpu: str | None = None) -> Policy:
        # vLLM sets max_num_batched_tokens to the max model length by default
        return super().build(kv_capacity_tokens, max_seq_len, {"max_tokens": max_seq_len, **{
            k: v for k, v in options.items() if v is not None}}, gpu)

    def schedule(self) -> BatchPlan | None:
        prefills: list = []
        tokens = 0
        while self.waiting and len(self.running) < self.max_batch_size:
            s = self.waiting.head()
            self._hit(s)
            # a prompt over the limit still runs alone, or a recomputed request could never come back
            if (prefills and tokens + s.prefill_remaining > self.max_tokens) or not self.kv.can_admit(s):
                self._unhit(s)
                break
            tokens += s.prefill_remaining
            prefills.append(s)
            self._admit(s)
            self._scheduled(s, s.prefill_end)
        if prefills:
            return hybrid([], prefills, [s.prefill_remaining for s in prefills])
        decodes = self._grow_decodes()
        if not decodes:
            return None
        return hybrid(decodes, [], [])
