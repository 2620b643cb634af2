"""A model shape (`sim.models.ModelSpec` fields) read from a Hugging Face `config.json` (`--model PATH`), for
the dense decoder families whose blocks have the Llama layout: Llama, Mistral, Qwen2 and Yi (pre-norm, rotary,
GQA attention, SwiGLU MLP), so the roofline, the profiler and the real engine (a random-weight
`LlamaForCausalLM` of that shape) all take it.

What a `ModelSpec` keeps is read from the file's `transformers` field names; what it leaves out is small:
Qwen2's QKV biases, Mistral's sliding window (as the catalogue's mistral-7b), norms and rotary tables.
Mixture-of-experts configs are refused: their MLP cost depends on routing, which no cost model here prices.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common.checks import is_int
from common.errors import InputError
from common.files import read_text

MODEL_TYPES = ("llama", "mistral", "qwen2", "yi")
ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "YiForCausalLM")
MOE_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size", "num_experts_per_tok")
MOE_TYPES = ("mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3", "dbrx", "jamba")
GATED_ACTIVATIONS = ("silu", "swish")


def is_config_path(name: str) -> bool:
    """Whether a --model value names a config file rather than a catalogue entry."""
    return str(name).endswith(".json") or Path(str(name)).is_file()


def _read(path: Path) -> dict[str, Any]:
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
    moe = [k for k in MOE_KEYS if c.get(k)]
    if model_type in MOE_TYPES or moe:
        what = f"model_type {model_type!r}" if model_type in MOE_TYPES else ", ".join(moe)
        raise InputError(f"--model {path}: a mixture-of-experts config ({what}); only dense decoders "
                         f"({', '.join(MODEL_TYPES)}) can be modelled")
    archs = c.get("architectures") or []
    if model_type not in MODEL_TYPES:
        raise InputError(f"--model {path}: model_type {model_type!r} is not a dense decoder simctl can model; "
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


def read_model_config(name: str) -> dict[str, Any]:
    """The `sim.models.ModelSpec` fields of a config.json; InputError (one line) for a file that is missing, not JSON, of a
    family or MoE kind it cannot model, or with missing or inconsistent shapes."""
    path = Path(name)
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
    return {"name": str(name), "num_layers": layers, "hidden_size": hidden, "num_heads": heads,
            "num_kv_heads": kv_heads, "head_dim": head_dim, "intermediate_size": mlp,
            "vocab_size": _positive(path, c, "vocab_size"),
            "max_position": _positive(path, c, "max_position_embeddings"), "tie_word_embeddings": tie,
            "description": f"{c['model_type']} from {path}: {layers} layers, d={hidden}, {heads}/{kv_heads} "
                           f"heads of {head_dim}, SwiGLU {mlp}"}
