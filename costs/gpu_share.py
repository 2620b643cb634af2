"""What one GPU of a tensor-parallel group holds of a model, Megatron-style: heads, MLP columns and vocabulary
split over tp; KV heads split when tp divides them, else each GPU holds one KV head, replicated. The roofline
prices from it (`costs.roofline`)."""

from __future__ import annotations

from dataclasses import dataclass

from catalogue.models import ModelSpec

GEMMS_PER_LAYER = 4  # QKV, O, gate+up (or up), down


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
    # (`Roofline.experts_read`), the rest of the weights once.
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
