"""A cost model fitted to profiled iterations of one model on one device (`profiler/fit.py` writes it).

Functional form (seconds per iteration; every quantity is a field of the `BatchPlan`):

    t = overhead_s
      + sqrt(linear_mem_s^2 + (linear_token_s x tiled(T))^2)            if T > 0   linear layers
      + sqrt(lm_head_mem_s^2 + (lm_head_row_s x tiled(r))^2)            if r > 0   LM head
      + attn_unit_s x sum_i q_i (c_i + q_i/2)                                      prefill attention compute
      + attn_kv_token_s x sum_i (c_i + q_i)                                        prefill attention KV read
      + attn_segment_s x (number of prefill segments)                              per-segment launches
      + decode_kv_token_s x decode_kv                                              decode attention KV read
      + decode_row_s x decode_rows                                                 per decode row

with T = `linear_tokens` (padding included), r = `sampled_tokens` (LM-head rows), segments i =
(`prefill_q`, `prefill_c`) and tiled(n) = n for n <= tile, else n rounded up to a multiple of the fitted
`tile` (as `Roofline.tiled`: a GEMM over more than one row tile pays for whole tiles; below one tile the
kernels use smaller tiles or GEMV).

Why this form:
- The linear layers and the LM head use the roofline's soft knee sqrt(mem^2 + (per_token x T)^2): a floor
  for streaming the weights (memory-bound small batches) blending into a per-token slope (compute-bound large
  batches). design.md reads off a published Llama-2-7B/A100 profile that this blend stays within ~5% from
  T = 1 to 4096 where max() is up to 25% low at the knee; and it *nests* the piecewise-linear form: with
  mem = 0 it is exactly overhead + per_token x T, which is what CPU timings of the tiny models look like
  (the fit picks mem = 0 there). A hard max() would not fit either.
- Tile quantization is a fitted parameter: a step in time at every tile boundary above one tile
  (Sarathi-Serve measured chunk 257 up to 32% slower than 256).
- Attention is priced from what it does: compute ~ q(c + q/2) per segment (a varlen kernel; padded or
  dense-masked layouts arrive as segments of the padded length, so pads are paid), KV read ~ (c + q), and a
  per-segment cost. Decode attention is memory-bound: it is linear in the KV tokens read (padded KV
  included) plus a per-row cost. The profile CSV only holds these sums, so they enter linearly.
- A fixed overhead (launches, Python, sampling) absorbs everything independent of the batch.

All coefficients are >= 0 (the fit bounds them), so every term is monotone in its field.

KV capacity: the model carries the model shape and dtype it was fitted for, hence `kv_bytes_per_token` and
`weight_bytes`, and the device memory when the profile recorded it (`memory_bytes`, null otherwise, e.g. on
a CPU whose meta.json did not say). `kv_capacity_tokens(memory_bytes=None, ...)` sizes the cache as the
roofline does: memory x utilization - weights - activation reserve, over KV bytes per token; a caller with no
recorded memory passes it (a CLI option), or keeps using the Roofline/catalogue for capacity.
"""

from __future__ import annotations

import json
import math
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from policies.plan import BatchPlan
from sim.cost.base import CostModel
from sim.cost.roofline import DEFAULT_ACTIVATION_RESERVE_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION
from sim.gpus import GiB
from sim.models import ModelSpec
from simctl.errors import InputError

FORMAT = "simctl.fitted-cost-model"
VERSION = 1

# The coefficients, in the order the fit and `predict_arrays` use.
COEFFICIENTS: tuple[str, ...] = (
    "overhead_s",  # s per iteration
    "linear_mem_s",  # s: weight-streaming floor of the linear layers
    "linear_token_s",  # s per tiled linear token
    "lm_head_mem_s",  # s: weight-streaming floor of the LM head (when any row is sampled)
    "lm_head_row_s",  # s per tiled sampled row
    "attn_unit_s",  # s per q (c + q/2) of prefill segments
    "attn_kv_token_s",  # s per (c + q) of prefill segments
    "attn_segment_s",  # s per prefill segment
    "decode_kv_token_s",  # s per KV token read by decode rows
    "decode_row_s",  # s per decode row
)

FORM = ("t = overhead_s + sqrt(linear_mem_s^2 + (linear_token_s*tiled(T))^2)[T>0] "
        "+ sqrt(lm_head_mem_s^2 + (lm_head_row_s*tiled(r))^2)[r>0] + attn_unit_s*sum q(c+q/2) "
        "+ attn_kv_token_s*sum(c+q) + attn_segment_s*segments + decode_kv_token_s*decode_kv "
        "+ decode_row_s*decode_rows; tiled(n) = n if n <= tile else ceil(n/tile)*tile")

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
               if f.name not in kwargs and f.name not in ("mlp", "tie_word_embeddings", "description")]
    if missing:
        raise InputError(f"model_shape lacks {', '.join(missing)}")
    try:
        return ModelSpec(**kwargs)
    except TypeError as e:
        raise InputError(f"model_shape: {e}") from None


def tiled_array(n: np.ndarray, tile: int) -> np.ndarray:
    """`Roofline.tiled` over an array: n up to one tile, else n rounded up to a multiple of the tile."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n <= tile, n, np.ceil(n / tile) * tile)


def predict_arrays(coef: dict[str, float] | np.ndarray, tile: int, linear_tokens, sampled_tokens, attn_units,
                   attn_kv_tokens, num_segments, decode_rows, decode_kv) -> np.ndarray:
    """The functional form over arrays of plan fields (the fit and reports use it; `Fitted` prices the same
    formula one plan at a time)."""
    c = (np.array([coef[k] for k in COEFFICIENTS], dtype=np.float64) if isinstance(coef, dict)
         else np.asarray(coef, dtype=np.float64))
    T = np.asarray(linear_tokens, dtype=np.float64)
    r = np.asarray(sampled_tokens, dtype=np.float64)
    lin = np.where(T > 0, np.sqrt(c[1] ** 2 + (c[2] * tiled_array(T, tile)) ** 2), 0.0)
    lm = np.where(r > 0, np.sqrt(c[3] ** 2 + (c[4] * tiled_array(r, tile)) ** 2), 0.0)
    return (c[0] + lin + lm + c[5] * np.asarray(attn_units, dtype=np.float64)
            + c[6] * np.asarray(attn_kv_tokens, dtype=np.float64)
            + c[7] * np.asarray(num_segments, dtype=np.float64)
            + c[8] * np.asarray(decode_kv, dtype=np.float64)
            + c[9] * np.asarray(decode_rows, dtype=np.float64))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


class Fitted(CostModel):
    """Prices a `BatchPlan` with coefficients fitted to a profile (see the module docstring for the form)."""

    def __init__(self, coefficients: dict[str, float], tile: int, model: str | None = None,
                 model_shape: dict[str, Any] | None = None, dtype_bytes: int | None = None,
                 memory_bytes: int | None = None, meta: dict[str, Any] | None = None,
                 fit: dict[str, Any] | None = None) -> None:
        if not isinstance(coefficients, dict):
            raise InputError("coefficients must be an object")
        missing = [k for k in COEFFICIENTS if k not in coefficients]
        if missing:
            raise InputError(f"coefficients lack {', '.join(missing)}")
        for k in COEFFICIENTS:
            v = coefficients[k]
            if not _number(v) or not math.isfinite(v):
                raise InputError(f"coefficient {k} must be a finite number, got {v!r}")
            if v < 0:
                raise InputError(f"coefficient {k} must be >= 0, got {v!r}")
        if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
            raise InputError(f"tile must be a positive integer, got {tile!r}")
        if memory_bytes is not None and (not _number(memory_bytes) or not memory_bytes > 0
                                         or not math.isfinite(memory_bytes)):
            raise InputError(f"memory_bytes must be a positive number or null, got {memory_bytes!r}")
        if dtype_bytes is not None:
            dtype_bytes = dtype_bytes_of(dtype_bytes)
        self.coefficients = {k: float(coefficients[k]) for k in COEFFICIENTS}
        self.tile = tile
        self.model = model
        self.model_shape = dict(model_shape) if model_shape is not None else None
        self.spec = model_spec_from_shape(model or "fitted", model_shape) if model_shape is not None else None
        self.dtype_bytes = dtype_bytes
        self.memory_bytes = int(memory_bytes) if memory_bytes is not None else None
        self.meta = dict(meta or {})
        self.fit = dict(fit or {})

        c = self.coefficients
        self._ovh = c["overhead_s"]
        self._lin_a2 = c["linear_mem_s"] ** 2
        self._lin_b = c["linear_token_s"]
        self._lm_a2 = c["lm_head_mem_s"] ** 2
        self._lm_b = c["lm_head_row_s"]
        self._pa_unit = c["attn_unit_s"]
        self._pa_kv = c["attn_kv_token_s"]
        self._pa_seg = c["attn_segment_s"]
        self._dkv = c["decode_kv_token_s"]
        self._drow = c["decode_row_s"]

    def __repr__(self) -> str:
        dev = self.meta.get("device_name") or self.meta.get("device") or "?"
        return f"Fitted({self.model}, {dev}, tile={self.tile})"

    # ---- pricing ---------------------------------------------------------------------------------------
    def tiled(self, n: int) -> int:
        tile = self.tile
        return n if n <= tile else -(-n // tile) * tile

    def _fixed(self, plan: BatchPlan) -> float:
        """Everything but the decode KV term (the only one that changes over a decode stretch)."""
        t = self._ovh
        tile = self.tile
        T = plan.linear_tokens
        if T > 0:
            if T > tile:
                T = -(-T // tile) * tile
            b = self._lin_b * T
            t += math.sqrt(self._lin_a2 + b * b)
        r = plan.sampled_tokens
        if r > 0:
            if r > tile:
                r = -(-r // tile) * tile
            b = self._lm_b * r
            t += math.sqrt(self._lm_a2 + b * b)
        if plan.prefill_q:
            units2 = 0  # 2 x sum q (c + q/2), exact in integers
            kv = 0
            for q, c in zip(plan.prefill_q, plan.prefill_c):
                units2 += q * (2 * c + q)
                kv += c + q
            t += self._pa_unit * (0.5 * units2) + self._pa_kv * kv + self._pa_seg * len(plan.prefill_q)
        return t + self._drow * plan.decode_rows

    def iteration_time(self, plan: BatchPlan) -> float:
        return self._fixed(plan) + plan.decode_kv * self._dkv

    def decode_stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        if k <= 0:
            return np.empty(0)
        kv = plan.decode_kv + np.arange(k, dtype=np.int64) * plan.decode_rows
        return self._fixed(plan) + kv * self._dkv

    def breakdown(self, plan: BatchPlan) -> dict[str, float]:
        """The terms of `iteration_time(plan)` in seconds (reports and tests; not on the hot path)."""
        c = self.coefficients
        T, r = plan.linear_tokens, plan.sampled_tokens
        units = sum(q * (cc + 0.5 * q) for q, cc in zip(plan.prefill_q, plan.prefill_c))
        kv = sum(cc + q for q, cc in zip(plan.prefill_q, plan.prefill_c))
        return {
            "overhead": c["overhead_s"],
            "linear": math.hypot(c["linear_mem_s"], c["linear_token_s"] * self.tiled(T)) if T > 0 else 0.0,
            "lm_head": math.hypot(c["lm_head_mem_s"], c["lm_head_row_s"] * self.tiled(r)) if r > 0 else 0.0,
            "prefill_attention": (c["attn_unit_s"] * units + c["attn_kv_token_s"] * kv
                                  + c["attn_segment_s"] * len(plan.prefill_q)),
            "decode_attention": (c["decode_kv_token_s"] * plan.decode_kv
                                 + c["decode_row_s"] * plan.decode_rows),
        }

    # ---- the model it was fitted for -------------------------------------------------------------------
    def check_model(self, model: ModelSpec | str) -> None:
        """Refuse (InputError) to price a model other than the one profiled."""
        if self.model is None:
            return
        name = model.name if isinstance(model, ModelSpec) else str(model)
        if name.lower() != self.model.lower():
            raise InputError(f"the cost model was fitted for model {self.model!r}, not {name!r}; profile "
                             f"{name!r} and fit it, or run with --model {self.model}")
        if isinstance(model, ModelSpec) and self.spec is not None:
            for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                      "intermediate_size", "vocab_size", "mlp"):
                if getattr(model, f) != getattr(self.spec, f):
                    raise InputError(f"the cost model was fitted for a {self.model!r} with {f} = "
                                     f"{getattr(self.spec, f)!r}, but the catalogue's has "
                                     f"{getattr(model, f)!r}")

    # ---- memory --------------------------------------------------------------------------------------
    @property
    def kv_bytes_per_token(self) -> int | None:
        if self.spec is None or self.dtype_bytes is None:
            return None
        return self.spec.kv_bytes_per_token(self.dtype_bytes)

    @property
    def weight_bytes(self) -> int | None:
        if self.spec is None or self.dtype_bytes is None:
            return None
        return self.spec.weight_bytes(self.dtype_bytes)

    def kv_capacity_tokens(self, memory_bytes: float | None = None,
                           gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
                           activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES) -> int:
        """KV tokens the profiled device can cache: (memory x utilization - weights - activation reserve) /
        KV bytes per token, as `Roofline.kv_capacity_tokens`. `memory_bytes` defaults to the memory the
        profile recorded; InputError if there is none (pass it) or the model does not fit."""
        mem = self.memory_bytes if memory_bytes is None else memory_bytes
        if mem is None:
            raise InputError("the cost model does not record the device memory (the profile's meta.json had "
                             "no memory_bytes); give the device memory to size the KV cache")
        kvb, wb = self.kv_bytes_per_token, self.weight_bytes
        if kvb is None or wb is None:
            raise InputError("the cost model does not record the model shape and dtype needed to size the "
                             "KV cache")
        free = mem * gpu_memory_utilization - wb - activation_reserve_bytes
        tokens = int(free // kvb) if free > 0 else 0
        if tokens <= 0:
            raise InputError(f"{self.model} does not fit: weights {wb / GiB:.2f} GiB + activation reserve "
                             f"{activation_reserve_bytes / GiB:.2f} GiB exceed "
                             f"{gpu_memory_utilization:.0%} of "
                             f"{mem / GiB:.2f} GiB")
        return tokens

    # ---- file ----------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "version": VERSION,
            "form": FORM,
            "model": self.model,
            "model_shape": self.model_shape,
            "dtype_bytes": self.dtype_bytes,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "weight_bytes": self.weight_bytes,
            "memory_bytes": self.memory_bytes,
            "meta": self.meta,
            "tile": self.tile,
            "coefficients": dict(self.coefficients),
            "fit": self.fit,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fitted:
        if not isinstance(data, dict):
            raise InputError("not a JSON object")
        if data.get("format") != FORMAT:
            raise InputError(f"not a fitted cost model (format is {data.get('format')!r}, "
                             f"expected {FORMAT!r})")
        if data.get("version") != VERSION:
            raise InputError(f"unsupported version {data.get('version')!r} (this simctl reads {VERSION})")
        required = ("model", "model_shape", "dtype_bytes", "tile", "coefficients")
        missing = [k for k in required if k not in data]
        if missing:
            raise InputError(f"missing key(s) {', '.join(missing)}")
        model = data["model"]
        if model is not None and not isinstance(model, str):
            raise InputError(f"model must be a string, got {model!r}")
        return cls(data["coefficients"], data["tile"], model=model, model_shape=data["model_shape"],
                   dtype_bytes=data["dtype_bytes"], memory_bytes=data.get("memory_bytes"),
                   meta=data.get("meta") or {}, fit=data.get("fit") or {})

    @classmethod
    def load(cls, path: str | Path) -> Fitted:
        """Read a cost_model.json; any problem is an InputError naming the file in one line."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise InputError(f"cost model {path}: no such file") from None
        except (OSError, UnicodeDecodeError) as e:
            why = getattr(e, "strerror", None) or e
            raise InputError(f"cost model {path}: cannot read ({why})") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise InputError(f"cost model {path}: not valid JSON ({e.msg} at line {e.lineno})") from None
        try:
            return cls.from_json(data)
        except InputError as e:
            raise InputError(f"cost model {path}: {e}") from None
