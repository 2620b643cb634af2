"""Build a Llama-style model from a catalogue shape, with random weights, for timing and real execution.

Nothing is downloaded: the model is a `transformers` `LlamaForCausalLM` built from a `LlamaConfig` filled in
from a `catalogue.models.ModelSpec` (a mixture of experts: `MixtralForCausalLM` from a `MixtralConfig`, whose
router really routes each token to its top-k experts), initialised from a seed. Its attention layers call
`ragged_attention` (`executor/ragged.py`), registered with transformers' `AttentionInterface` under
`ATTN_IMPLEMENTATION`; the executor there hands each forward its KV slab and segment layout through a
model-forward keyword argument, which transformers passes through every layer to the attention function.

`reference_model` is the same weights with transformers' own SDPA attention: the tests check the executor
against it.
"""

from __future__ import annotations

import copy
from typing import TYPE_CHECKING, Any

from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

DTYPES = ("float32", "float16", "bfloat16")
DEVICES = ("cpu", "cuda")


def torch_dtype(name: str) -> torch.dtype:
    """`"float32"` -> `torch.float32`; InputError for anything else than DTYPES."""
    import torch

    if isinstance(name, torch.dtype):
        return name
    if name not in DTYPES:
        raise InputError(f"dtype {name!r} not supported; choose one of {', '.join(DTYPES)}")
    return getattr(torch, name)


def resolve_device(device: str) -> torch.device:
    """`cpu`, or `cuda` when it is available (InputError otherwise: no silent fallback to the CPU)."""
    import torch

    name = str(device).lower()
    if name not in DEVICES and not name.startswith("cuda:"):
        raise InputError(f"device {device!r} not supported; choose cpu or cuda")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {device}: cuda requested but not available (torch {torch.__version__} "
                         "finds no CUDA device here); use --device cpu, or a machine with a GPU")
    return torch.device(name)


def _shape(spec: ModelSpec, attn_implementation: str | None) -> dict[str, Any]:
    """The config fields a Llama and a Mixtral share, from `spec`."""
    from simctl.executor.ragged_attention import ATTN_IMPLEMENTATION, register_attention

    if spec.mlp != "gated":
        raise InputError(f"model {spec.name!r}: only gated (SwiGLU, Llama-style) MLPs can be built "
                         f"for profiling, not {spec.mlp!r}")
    if attn_implementation is None:
        register_attention()
        attn_implementation = ATTN_IMPLEMENTATION
    return {
        "vocab_size": spec.vocab_size,
        "hidden_size": spec.hidden_size,
        "num_hidden_layers": spec.num_layers,
        "num_attention_heads": spec.num_heads,
        "num_key_value_heads": spec.num_kv_heads,
        "head_dim": spec.head_dim,
        "max_position_embeddings": spec.max_position,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "hidden_act": "silu",
        "use_cache": False,  # the executor keeps its own KV slab: never let transformers build a DynamicCache
        "attn_implementation": attn_implementation,
    }


def llama_config(spec: ModelSpec, attn_implementation: str | None = None) -> PretrainedConfig:
    """A `LlamaConfig` with the shape of `spec` (a dense SwiGLU Llama-style shape)."""
    from transformers import LlamaConfig

    if spec.moe is not None:
        raise InputError(f"model {spec.name!r} is a mixture of experts, not a Llama-style dense model")
    return LlamaConfig(intermediate_size=spec.intermediate_size, **_shape(spec, attn_implementation))


def mixtral_config(spec: ModelSpec, attn_implementation: str | None = None) -> PretrainedConfig:
    """A `MixtralConfig` with the shape of `spec`: an MoE whose every layer is sparse, without shared experts
    (Mixtral's, and Qwen3-MoE's but for its QK norms)."""
    from transformers import MixtralConfig

    moe = spec.moe
    if moe is None or moe.shared_size or moe.dense_layers:
        raise InputError(f"model {spec.name!r}: only mixture-of-experts shapes without shared experts or "
                         "dense layers (Mixtral-style) can be built")
    return MixtralConfig(intermediate_size=moe.expert_size, num_local_experts=moe.experts,
                         num_experts_per_tok=moe.experts_per_token, router_jitter_noise=0.0,
                         output_router_logits=False, sliding_window=None, **_shape(spec, attn_implementation))


def hf_config(spec: ModelSpec, attn_implementation: str | None = None) -> PretrainedConfig:
    """The transformers config of `spec`: a `LlamaConfig`, or a `MixtralConfig` for a mixture of experts."""
    return (llama_config if spec.moe is None else mixtral_config)(spec, attn_implementation)


def architecture(spec: ModelSpec) -> str:
    """The transformers model class `spec` builds (config.json's `architectures`)."""
    return "LlamaForCausalLM" if spec.moe is None else "MixtralForCausalLM"


def _model_class(spec: ModelSpec) -> type[PreTrainedModel]:
    import transformers

    return getattr(transformers, architecture(spec))


def build_model(spec: ModelSpec, device: str | torch.device = "cpu", dtype: str = "float32", seed: int = 0, *,
                attn_implementation: str | None = None) -> PreTrainedModel:
    """`LlamaForCausalLM` (an MoE: `MixtralForCausalLM`) of shape `spec` with random weights drawn from
    `seed`, on `device` in `dtype`, in eval mode with gradients off. Attention is the ragged executor's
    (`executor.ragged`) unless `attn_implementation` names another (e.g. "sdpa" for a reference model)."""
    import torch

    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    dt = torch_dtype(dtype)
    config = hf_config(spec, attn_implementation)
    # Built directly on the device in the target dtype (a 7B model never goes through host memory in fp32).
    # Same seed, device and dtype: same weights.
    with torch.random.fork_rng(devices=[dev] if dev.type == "cuda" else []), torch.device(dev):
        torch.manual_seed(seed)
        model = _model_class(spec)._from_config(config, dtype=dt)
    model.eval()
    model.requires_grad_(False)
    return model


def reference_model(model: PreTrainedModel, attn_implementation: str = "sdpa") -> PreTrainedModel:
    """A copy of `model` (same weights) running transformers' own attention implementation."""
    config = copy.deepcopy(model.config)
    config._attn_implementation = attn_implementation
    ref = type(model)(config).to(device=model.device, dtype=model.dtype).eval()
    ref.load_state_dict(model.state_dict())
    ref.requires_grad_(False)
    return ref
