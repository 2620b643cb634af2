"""The attention function the ragged executor (`simctl.executor.ragged`) registers with transformers as
ATTN_IMPLEMENTATION: the layout of an iteration it is handed (`Batch`, through the model-forward keyword
BATCH_KWARG), the KV writes into the slab and the SDPA calls of each kind of row (decode rows, prefill
segments, padded and bin-packed batches), and which kernel each kind of call gets (`noting_kernels`).

Kernels (`simctl.executor.config.ExecutorConfig`, given to the executor): every forward runs under
`torch.nn.attention.sdpa_kernel` with the SDPA backends its `attention` setting allows (by default never
cuDNN, whose plans are per KV length). Grouped-query heads (G = H / KVH query heads per K/V head) never use
`enable_gqa` under a mask nor repeated K/V heads: a non-causal call (decode rows, chunks on cached context,
padded and dense bin-packed rows) folds each group's G heads into the query axis, `[B, KVH, G x L, D]`
against the group's K/V, its mask repeated G times along the query axis (once per iteration; a decode row's
one-row mask broadcasts), so the memory-efficient kernel, the one fused CUDA kernel that takes a mask, runs
it. A causal call (a prompt from position 0) runs as one enable_gqa call where an allowed kernel takes it
(flash in 16-bit floats), else as G calls. `attention_kernels` records which kernel each kind of call got.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

ATTN_IMPLEMENTATION = "simctl_ragged"
BATCH_KWARG = "simctl_batch"  # the model-forward keyword that carries the layout to the attention function


# ---- layout handed to the attention function --------------------------------------------------------------


@dataclass(slots=True)
class DecodeRows:
    tokens: slice | torch.Tensor  # positions of the decode rows in the flattened [T] tokens, in slot order
    slots: slice  # the slab rows spanning their slots, lo..hi
    rows: torch.Tensor | None  # each decode row's place in that span (None: the span has no holes)
    kmax: int
    mask: torch.Tensor | None  # [span, 1, 1, kmax] additive, or None when every row sees all kmax columns


@dataclass(slots=True)
class PrefillSegment:
    start: int
    q: int
    slot: int
    cached: int
    mask: torch.Tensor | None  # [1, 1, q, c + q] additive; None: c == 0, plain causal


@dataclass(frozen=True, slots=True)
class AttentionLayout:
    """How an executor calls SDPA (`sdpa`): the kernels it allows and its grouped-query layout."""

    backends: tuple[SDPBackend, ...]
    groups: int  # G = query heads per KV head
    # a causal grouped-query call runs as one enable_gqa kernel (else one per query head of a group)
    gqa_causal: bool


@dataclass(slots=True)
class Batch:
    kv: torch.Tensor
    attn: AttentionLayout
    padded: bool
    write_slot: torch.Tensor  # ragged: [T]; padded: [B, 1]
    write_pos: torch.Tensor  # ragged: [T]; padded: [B, L]
    decodes: DecodeRows | None = None
    prefills: list[PrefillSegment] = field(default_factory=list)
    # padded mode
    slots: slice | torch.Tensor | None = None
    kmax: int = 0
    mask: torch.Tensor | None = None
    is_causal: bool = False
    # bin-packed mode: the real (non-pad) tokens of the flattened [B x L] rows; attention within each row
    real: torch.Tensor | None = None
    spans: list[tuple[int, int, int]] | None = None  # varlen bin-packed: (row, start, q) of each prompt


BACKENDS = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "math": SDPBackend.MATH, "cudnn": SDPBackend.CUDNN_ATTENTION}
_BACKEND_NAME = {b: name for name, b in BACKENDS.items()}
_kernels_seen: dict[str, str] | None = None  # while `noting_kernels` runs: kind of call -> kernel chosen


@contextmanager
def noting_kernels() -> Iterator[dict[str, str]]:
    """Within it, every SDPA call notes torch's choice of kernel (`torch._fused_sdp_choice`) for its kind
    (`simctl.executor.ragged.attention_kernels`) in the dict it yields."""
    global _kernels_seen
    seen: dict[str, str] = {}
    _kernels_seen = seen
    try:
        yield seen
    finally:
        _kernels_seen = None


def _call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
          scale: float, gqa: bool, kind: str, layout: str) -> torch.Tensor:
    if _kernels_seen is not None:
        kind += "_masked" if mask is not None else "_causal" if is_causal else ""
        try:
            chosen = SDPBackend(torch._fused_sdp_choice(q, k, v, mask, 0.0, is_causal, scale=scale,
                                                        enable_gqa=gqa))
        except RuntimeError:  # no kernel (CUDA says so before the call): this kind is the last one noted
            _kernels_seen.setdefault(kind, "none")
            raise
        _kernels_seen.setdefault(kind, _BACKEND_NAME.get(chosen, chosen.name.lower()) + layout)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale,
                                          enable_gqa=gqa)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool,
          scale: float, attn: AttentionLayout, kind: str) -> torch.Tensor:
    """SDPA of q `[B, H, L, D]` against k, v `[B, KVH, K, D]`, where the G = H / KVH query heads h = j G + g
    share K/V head j, without repeating K/V heads. A non-causal call folds each group's G heads into the query
    axis, `[B, KVH, G L, D]` (`mask` comes folded: query axis 1, or G L as `_fold`), so every kernel that
    takes plain heads runs it: the memory-efficient one, the only fused CUDA kernel that takes a mask, does
    not take grouped heads. A causal call cannot fold (each head's diagonal would shift): one enable_gqa
    call where the allowed kernels run one, else one call per head of a group."""
    G = attn.groups
    if G == 1:
        return _call(q, k, v, mask, is_causal, scale, False, kind, "")
    B, H, L, D = q.shape
    if not is_causal:
        return _call(q.reshape(B, H // G, G * L, D), k, v, mask, False, scale, False, kind, " (folded)"
                     ).reshape(B, H, L, D)
    if attn.gqa_causal:
        return _call(q, k, v, None, True, scale, True, kind, " (enable_gqa)")
    qg = q.unflatten(1, (H // G, G))
    return torch.stack([_call(qg[:, :, g], k, v, None, True, scale, False, kind, " (per group)")
                        for g in range(G)], 2).flatten(1, 2)


def ragged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, scaling: float | None = None, dropout: float = 0.0,
                     **kwargs: Any) -> tuple[torch.Tensor, None]:
    """The attention function registered as ATTN_IMPLEMENTATION. query `[B, H, T, D]`, key/value
    `[B, KVH, T, D]` (rotary applied); returns `[B, T, H, D]`."""
    batch: Batch | None = kwargs.get(BATCH_KWARG)
    if batch is None:
        raise RuntimeError(f"attention {ATTN_IMPLEMENTATION!r} runs only inside RaggedExecutor (no "
                           f"{BATCH_KWARG!r} given)")
    scale = module.scaling if scaling is None else scaling
    kc = batch.kv[module.layer_idx, 0]  # [S, KVH, M, D]
    vc = batch.kv[module.layer_idx, 1]
    if batch.real is not None:  # bin-packed rows: each prompt's KV to its own slot; attention within the row
        B, KVH, L, D = key.shape
        kc[batch.write_slot, :, batch.write_pos] = key.transpose(1, 2).reshape(B * L, KVH, D)[batch.real]
        vc[batch.write_slot, :, batch.write_pos] = value.transpose(1, 2).reshape(B * L, KVH, D)[batch.real]
        if batch.spans is None:  # one dense-masked L x L block per row
            return sdpa(query, key, value, batch.mask, False, scale, batch.attn,
                         "binpacked").transpose(1, 2), None
        out = query.new_zeros(query.shape)  # varlen: causal attention within each prompt; pads give zeros
        for b, start, q in batch.spans:
            part = slice(start, start + q)
            out[b:b + 1, :, part] = sdpa(query[b:b + 1, :, part], key[b:b + 1, :, part],
                                          value[b:b + 1, :, part], None, True, scale, batch.attn, "binpacked")
        return out.transpose(1, 2), None
    if batch.padded:
        kc[batch.write_slot, :, batch.write_pos] = key.transpose(1, 2)  # [B, L, KVH, D]
        vc[batch.write_slot, :, batch.write_pos] = value.transpose(1, 2)
        k = kc[batch.slots, :, :batch.kmax]
        v = vc[batch.slots, :, :batch.kmax]
        return sdpa(query, k, v, batch.mask, batch.is_causal, scale, batch.attn,
                     "padded").transpose(1, 2), None

    q0 = query[0]  # [H, T, D]
    kc[batch.write_slot, :, batch.write_pos] = key[0].transpose(0, 1)  # [T, KVH, D]
    vc[batch.write_slot, :, batch.write_pos] = value[0].transpose(0, 1)
    out = query.new_empty(q0.shape[1], q0.shape[0], q0.shape[2])  # [T, H, D]
    d = batch.decodes
    if d is not None:
        qd = q0[:, d.tokens].transpose(0, 1).unsqueeze(2)  # [n, H, 1, D]
        if d.rows is not None:  # holes get a zero query (finite output, dropped)
            qd = qd.new_zeros(d.slots.stop - d.slots.start, *qd.shape[1:]).index_copy_(0, d.rows, qd)
        o = sdpa(qd, kc[d.slots, :, :d.kmax], vc[d.slots, :, :d.kmax], d.mask, False, scale, batch.attn,
                  "decode")[:, :, 0]
        out[d.tokens] = o if d.rows is None else o.index_select(0, d.rows)
    for p in batch.prefills:
        qp = q0[:, p.start:p.start + p.q].unsqueeze(0)  # [1, H, q, D]
        k = kc[p.slot:p.slot + 1, :, :p.cached + p.q]
        v = vc[p.slot:p.slot + 1, :, :p.cached + p.q]
        out[p.start:p.start + p.q] = sdpa(qp, k, v, p.mask, p.mask is None, scale, batch.attn,
                                           "prefill")[0].transpose(0, 1)
    return out.unsqueeze(0), None


def register_attention() -> None:
    """Register `ragged_attention` with transformers (idempotent)."""
    from transformers import AttentionInterface

    AttentionInterface.register(ATTN_IMPLEMENTATION, ragged_attention)


register_attention()


@cache
def attention_layout(backends: tuple[str, ...], device: torch.device, dtype: torch.dtype, heads: int,
                     kv_heads: int, head_dim: int) -> AttentionLayout:
    """The attention layout of a model on `device`: whether the allowed kernels run a causal grouped-query
    call as one enable_gqa call (tried once on a small one)."""
    chosen = tuple(BACKENDS[b] for b in backends)
    gqa_causal = heads == kv_heads
    if not gqa_causal:
        q = torch.zeros(1, heads, 8, head_dim, dtype=dtype, device=device)
        kv = torch.zeros(1, kv_heads, 8, head_dim, dtype=dtype, device=device)
        try:
            with torch.inference_mode(), sdpa_kernel(list(chosen)):
                F.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
            gqa_causal = True
        except RuntimeError:  # "No available kernel": e.g. fp32 on CUDA, where flash does not run
            pass
    return AttentionLayout(chosen, heads // kv_heads, gqa_causal)
