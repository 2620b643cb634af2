"""Policy names, their one-line descriptions, and how each is built with the KV manager it assumes."""

from __future__ import annotations

from policies.base import Policy
from policies.faster_transformer import FasterTransformer
from policies.kv import PagedKV, ReservedKV
from policies.orca import Orca
from policies.sarathi import ChunkedPrefillsOnly, HybridBatchingOnly, SarathiServe
from policies.vllm import VLLM

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (FasterTransformer, Orca, VLLM, SarathiServe, HybridBatchingOnly, ChunkedPrefillsOnly)
}
RESERVING = (FasterTransformer, Orca)  # reserve the maximum sequence length at admission


def make_policy(name: str, kv_capacity_tokens: int, max_seq_len: int, max_batch_size: int | None = None,
                token_budget: int | None = None) -> Policy:
    """Build a policy with its KV manager. `max_seq_len` is what a reserving policy sets aside per request
    (a deployment's max model length) and vLLM's per-iteration token limit."""
    cls = POLICIES[name]
    kwargs: dict[str, int] = {}
    if max_batch_size is not None:
        kwargs["max_batch_size"] = max_batch_size
    if issubclass(cls, RESERVING):
        return cls(ReservedKV(kv_capacity_tokens, max_seq_len), **kwargs)
    if issubclass(cls, SarathiServe):
        if token_budget is not None:
            kwargs["token_budget"] = token_budget
        return cls(PagedKV(kv_capacity_tokens), **kwargs)
    return cls(PagedKV(kv_capacity_tokens), max_tokens=max_seq_len, **kwargs)


def max_admissible_tokens(name: str, kv_capacity_tokens: int, max_seq_len: int) -> int:
    """The longest request (prompt + output) a policy can ever run on this KV capacity."""
    cls = POLICIES[name]
    if issubclass(cls, RESERVING):
        return max_seq_len if max_seq_len <= kv_capacity_tokens else 0
    return PagedKV(kv_capacity_tokens).max_request_tokens
