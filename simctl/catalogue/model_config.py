"""A model shape (`simctl.catalogue.models.ModelSpec` fields) read from a Hugging Face `config.json` (`--model
PATH`, or the model's folder that holds it), for the decoder families whose blocks have the Llama layout:
the dense Llama, Mistral, Qwen2, Qwen3 and Yi (pre-norm, rotary, GQA attention, SwiGLU MLP), and the
mixture-of-experts Mixtral, Qwen2-MoE and Qwen3-MoE (the same attention; the MLP of their sparse layers a
router, top-k routed SwiGLU experts and Qwen2-MoE's shared expert: `catalogue.moe.MoE`), so the roofline,
the profiler and the real engine (a random-weight `LlamaForCausalLM`, or `MixtralForCausalLM` for an MoE,
of that shape) all take it.

What a `ModelSpec` keeps is read from the file's `transformers` field names; what it leaves out is small:
Qwen2's QKV biases, Qwen3's QK norms (dense and MoE alike: an RMSNorm over each head's query and key,
elementwise work of head_dim values per head), Mistral's sliding window (as the catalogue's mistral-7b),
norms and rotary tables. DeepSeek-V2/V3 are refused: their multi-head latent attention caches a compressed
latent per token and folds projections into the attention, which neither cost model nor the engine builds.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simctl.catalogue.moe import MoE
from simctl.common.checks import is_int
from simctl.common.errors import InputError
from simctl.common.files import read_text

DENSE_TYPES = ("llama", "mistral", "qwen2", "qwen3", "yi")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe")
MODEL_TYPES = DENSE_TYPES + MOE_TYPES
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                 "YiForCausalLM",
                 "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
            "num_experts_per_tok")
MLA_TYPES = ("deepseek_v2", "deepseek_v3")
GATED_ACTIVATIONS = ("silu", "swish")


def is_config_path(name: str) -> bool:
    """Whether a --model value names a config file, or a model's folder (which holds its config.json, as a
    downloaded model does), rather than a catalogue entry."""
    return str(name).endswith(".json") or Path(str(name)).is_file() or Path(str(name)).is_dir()


def config_file(name: str) -> Path:
    """The config.json a --model value names: the file itself, or the one in the folder it names."""
    path = Path(str(name))
    return path / "config.json" if path.is_dir() else path


def _read(path: Path) -> dict[str, Any]:
    if path.name == "config.json" and not path.is_file() and path.parent.is_dir():
        raise InputError(f"--model {path.parent}: the folder holds no config.json (a model's folder, as "
                         "Hugging Face downloads it, does)")
    text = read_text(path, f"--model {path}")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"--model {path}: not valid JSON ({e})") from None
    if not isinstance(data, dict):
        raise InputError(f"--model {path}: a config.json holds a JSON object, not {type(data).__name__}")
    return data


def _check_family(path: Path, c: dict[str, Any]) -> None:
    model_type = c.get("model_type")
    if model_type in MLA_TYPES or c.get("kv_lora_rank"):
        raise InputError(f"--model {path}: {model_type} uses multi-head latent attention (kv_lora_rank "
                         f"{c.get('kv_lora_rank')!r}), which simctl does not price: its KV cache is a "
                         "compressed latent and its attention absorbs projections, unlike the GQA every cost "
                         "model here assumes")
    moe = [k for k in MOE_KEYS if c.get(k)]
    if model_type in DENSE_TYPES and moe:
        raise InputError(f"--model {path}: model_type {model_type!r} is dense but the config has "
                         f"mixture-of-experts fields ({', '.join(moe)})")
    archs = c.get("architectures") or []
    if model_type not in MODEL_TYPES:
        raise InputError(f"--model {path}: model_type {model_type!r} is not a decoder simctl can model; "
                         f"known: {', '.join(MODEL_TYPES)}")
    if not isinstance(archs, list) or any(a not in ARCHITECTURES for a in archs):
        raise InputError(f"--model {path}: architectures {archs!r}: known are {', '.join(ARCHITECTURES)}")
    act = c.get("hidden_act", "silu")
    if act not in GATED_ACTIVATIONS:
        raise InputError(f"--model {path}: hidden_act {act!r}: these families use a gated SiLU MLP (silu)")


def _positive(path: Path, c: dict[str, Any], key: str, default: Any = None) -> int:
    v = c.get(key, default)
    if v is None:
        raise InputError(f"--model {path}: {key} is missing")
    if not is_int(v) or v <= 0:
        raise InputError(f"--model {path}: {key} must be a positive integer, got {v!r}")
    return int(v)


def _moe(path: Path, c: dict[str, Any], layers: int) -> MoE | None:
    """The sparse layers' MLP of a Mixtral, Qwen2-MoE or Qwen3-MoE config (None for a dense one), with
    transformers' layer rule: Mixtral's every layer is sparse; a Qwen MoE's layer i is unless i is in
    `mlp_only_layers` or (i + 1) is not a multiple of `decoder_sparse_step`."""
    model_type = c["model_type"]
    if model_type not in MOE_TYPES:
        return None
    k = _positive(path, c, "num_experts_per_tok")
    if model_type == "mixtral":
        return _checked(path, lambda: MoE(_positive(path, c, "num_local_experts"), k,
                                          _positive(path, c, "intermediate_size")))
    step = _positive(path, c, "decoder_sparse_step", 1)
    only = c.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(is_int(i) and 0 <= i < layers for i in only):
        raise InputError(
            f"--model {path}: mlp_only_layers must list layer indices below {layers}, got {only!r}")
    dense = sum(1 for i in range(layers) if i in only or (i + 1) % step)
    shared = c.get("shared_expert_intermediate_size", 0) if model_type == "qwen2_moe" else 0
    if not is_int(shared) or shared < 0:
        raise InputError(f"--model {path}: shared_expert_intermediate_size must be an integer >= 0, got "
                         f"{shared!r}")
    if dense == layers:
        raise InputError(f"--model {path}: no layer is sparse (mlp_only_layers {only}, decoder_sparse_step "
                         f"{step}); give it as a dense model")
    return _checked(path, lambda: MoE(_positive(path, c, "num_experts"), k,
                                      _positive(path, c, "moe_intermediate_size"), int(shared), dense))


def _checked(path: Path, build: Callable[[], MoE]) -> MoE:
    try:
        return build()
    except InputError as e:
        raise InputError(f"--model {path}: {e}") from None


def read_model_config(name: str) -> dict[str, Any]:
    """The `catalogue.models.ModelSpec` fields of a config.json; InputError (one line) for a file that is
    missing, not JSON, of a family or attention it cannot model, or with missing or inconsistent shapes."""
    path = config_file(name)
    c = _read(path)
    _check_family(path, c)
    hidden = _positive(path, c, "hidden_size")
    heads = _positive(path, c, "num_attention_heads")
    kv_heads = _positive(path, c, "num_key_value_heads", heads)  # absent: multi-head attention
    if hidden % heads:
        raise InputError(f"--model {path}: num_attention_heads ({heads}) must divide hidden_size ({hidden})")
    if heads % kv_heads:
        raise InputError(f"--model {path}: num_key_value_heads ({kv_heads}) must divide num_attention_heads "
                         f"({heads})")
    head_dim = _positive(path, c, "head_dim", hidden // heads)
    tie = c.get("tie_word_embeddings", False)
    if not isinstance(tie, bool):
        raise InputError(f"--model {path}: tie_word_embeddings must be true or false, got {tie!r}")
    layers = _positive(path, c, "num_hidden_layers")
    mlp = _positive(path, c, "intermediate_size")
    moe = _moe(path, c, layers)
    if moe is None:
        what = f"SwiGLU {mlp}"
    else:
        what = (f"{moe.experts} SwiGLU experts of {moe.expert_size}, top-{moe.experts_per_token}"
                + (f", shared {moe.shared_size}" if moe.shared_size else "")
                + (f", {moe.dense_layers} dense layers of {mlp}" if moe.dense_layers else ""))
    return {"name": str(name), "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": kv_heads, "head_dim": head_dim, "intermediate_size": mlp,
            "vocab_size": _positive(path, c, "vocab_size"),
            "max_position": _positive(path, c, "max_position_embeddings"), "tie_word_embeddings": tie,
            "moe": moe,
            "description": f"{c['model_type']} from {path}: {layers} layers, d={hidden}, {heads}/{kv_heads} "
                           f"heads of {head_dim}, {what}"}
