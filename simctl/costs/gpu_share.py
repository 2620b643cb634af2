"""What one GPU of a tensor-parallel group holds of a model, Megatron-style: heads, MLP columns and vocabulary
split over tp; KV heads split when tp divides them, else each GPU holds one KV head, replicated. The roofline
prices from it (`simctl.costs.roofline`)."""

from __future__ import annotations

from dataclasses import dataclass

from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError

GEMMS_PER_LAYER = 4  # QKV, O, gate+up (or up), down


def check_split(m: ModelSpec, tp: int, dtype_bytes: int, tile: int) -> None:
    """InputError, in one line, for a TP degree the heads cannot split over, or a bad dtype or tile."""
    if not isinstance(tp, int) or tp < 1:
        raise InputError(f"tp must be a positive integer, got {tp!r}")
    if m.num_heads % tp:
        raise InputError(f"tp={tp} must divide {m.name}'s {m.num_heads} attention heads")
    if m.num_kv_heads % tp and tp % m.num_kv_heads:
        raise InputError(f"tp={tp} and {m.name}'s {m.num_kv_heads} KV heads: one must divide the other")
    if not isinstance(dtype_bytes, int) or dtype_bytes < 1:
        raise InputError(f"dtype_bytes must be a positive integer, got {dtype_bytes!r}")
    if not isinstance(tile, int) or tile < 1:
        raise InputError(f"tile must be a positive integer, got {tile!r}")


def check_expert_parallel(ep: int, model: ModelSpec, tp: int) -> int:
    """`ep` checked: 1, or the TP degree of an MoE whose experts it divides (`catalogue.moe.busiest_gpu`)."""
    if isinstance(ep, bool) or not isinstance(ep, int) or ep < 1:
        raise InputError(f"--ep must be a positive integer, got {ep!r}")
    if ep == 1:
        return ep
    if model.moe is None:
        raise InputError(f"--ep {ep}: {model.name} is dense (no experts to spread)")
    if ep != tp:
        raise InputError(f"--ep {ep} must equal --tp {tp}: the experts are spread over the replica's TP "
                         "group (vLLM's --enable-expert-parallel without data parallelism)")
    if model.moe.experts % ep:
        raise InputError(f"--ep {ep} must divide {model.name}'s {model.moe.experts} experts")
    return ep


@dataclass(frozen=True, slots=True)
class GPUShare:
    kv_heads: int
    linear_params: float  # resident: every expert of an MoE
    active_params: float  # computed per token: an MoE's router, shared and k routed experts
    read_params: float  # read once per iteration besides the routed experts (dense: all of them)
    expert_params: float  # one routed expert in every sparse layer (MoE; else 0)
    lm_head_params: float
    embedding_params: float  # the embedding and LM head
    gemms: int  # GEMMs of one forward


def gpu_share(m: ModelSpec, tp: int) -> GPUShare:
    L, h, d = m.num_layers, m.hidden_size, m.head_dim
    heads_gpu = m.num_heads // tp
    kv_heads = max(1, m.num_kv_heads // tp)
    lm_head, embedding = m.lm_head_params / tp, m.embedding_lm_head_params / tp
    if m.moe is None:
        lin_per_layer_gpu = (h * d * (heads_gpu + 2 * kv_heads)  # QKV
                             + heads_gpu * d * h  # O
                             + m.mlp_params_per_layer / tp)  # MLP
        linear = L * lin_per_layer_gpu
        return GPUShare(kv_heads, linear, linear, linear, 0.0, lm_head, embedding, GEMMS_PER_LAYER * L)
    # MoE: every expert's columns split over tp (each GPU runs its share of every expert); the router is
    # replicated. A token computes its k routed experts; an iteration reads the experts its tokens chose
    # (`Roofline._experts`), the rest of the weights once.
    moe, sparse = m.moe, m.sparse_layers
    attention = L * (h * d * (heads_gpu + 2 * kv_heads) + heads_gpu * d * h)
    always = (attention + moe.dense_layers * m.mlp_params_per_layer / tp
              + sparse * (m.router_params + m.shared_expert_params / tp))
    experts = sparse * m.expert_params / tp
    # a sparse layer's GEMMs: QKV, O, the router, the experts' gate+up and down (grouped), the shared expert's
    # two
    gemms = GEMMS_PER_LAYER * moe.dense_layers + sparse * (5 + (2 if moe.shared_size else 0))
    active = always + moe.experts_per_token * experts
    resident = always + moe.experts * experts
    return GPUShare(kv_heads, resident, active, always, experts, lm_head, embedding, gemms)
