"""A model as a profile or a fit records it: its shape (`ModelSpec` fields, meta.json's `model_shape`) and
its dtype's bytes per element (as torch or meta.json spell the dtype)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError

_DTYPE_BYTES = {
    "float32": 4, "fp32": 4, "float": 4, "float64": 8, "double": 8, "float16": 2, "fp16": 2, "half": 2,
    "bfloat16": 2, "bf16": 2, "int8": 1, "float8": 1, "fp8": 1,
}


def dtype_bytes_of(dtype: Any) -> int:
    """Bytes per element of a dtype as torch or meta.json spell it ("torch.bfloat16", "float32", ...)."""
    if isinstance(dtype, int) and not isinstance(dtype, bool) and dtype > 0:
        return dtype
    name = str(dtype).strip().lower().removeprefix("torch.")
    if name.startswith("float8"):
        name = "float8"
    if name not in _DTYPE_BYTES:
        raise InputError(f"unknown dtype {dtype!r}; known: {', '.join(_DTYPE_BYTES)}")
    return _DTYPE_BYTES[name]


def model_spec_from_shape(name: str, shape: dict[str, Any]) -> ModelSpec:
    """A `ModelSpec` from a dict of its fields (meta.json's `model_shape`); unknown keys are ignored."""
    if not isinstance(shape, dict):
        raise InputError(f"model_shape must be an object of ModelSpec fields, got {type(shape).__name__}")
    known = {f.name for f in fields(ModelSpec)}
    kwargs = {k: v for k, v in shape.items() if k in known}
    kwargs.setdefault("name", name)
    missing = [f.name for f in fields(ModelSpec)
               if f.name not in kwargs and f.name not in ("mlp", "tie_word_embeddings", "description", "moe")]
    if missing:
        raise InputError(f"model_shape lacks {', '.join(missing)}")
    try:
        return ModelSpec(**kwargs)
    except TypeError as e:
        raise InputError(f"model_shape: {e}") from None
