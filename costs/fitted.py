"""A cost model fitted to profiled iterations of one model on one device (`profiler/fit.py` writes it).

Functional form (seconds per iteration; every quantity is a field of the `BatchPlan`):

    t = overhead_s
      + linear(tiled(T))                                           linear layers (T > 0)
      + lm_head(tiled(r))                                          LM head (r > 0)
      + attn_unit_s x sum_i q_i (c_i + q_i/2)                      prefill attention compute (q_i (c_i + q_i)
                                                                   for dense-masked blocks)
      + attn_kv_token_s x sum_i (c_i + q_i)                        prefill attention KV read
      + attn_segment_s x (number of prefill segments)              per-segment launches
      + decode_rows x (decode_row_s + decode_kv(decode_kv / decode_rows))   decode attention, per row
      + decode_pad_token_s x decode_pad_kv                         ... and padding to the longest row

with T = `linear_tokens` (padding included), r = `sampled_tokens` (LM-head rows), segments i =
(`prefill_q`, `prefill_c`), decode_kv / decode_rows the mean KV tokens a decode row reads (its context + 1,
padding included), decode_pad_kv = `decode_pad_kv(plan)` (below), and tiled(n) = n for n <= tile, else n
rounded up to a multiple of the fitted `tile` (as `Roofline.tiled`: a GEMM over more than one row tile pays
for whole tiles; below one tile the kernels use smaller tiles or GEMV).

`linear`, `lm_head` and `decode_kv` are monotone piecewise-linear curves given by knot tables [(n_0, s_0),
(n_1, s_1), ...] (n strictly increasing, s non-decreasing, >= 0): linear interpolation between knots, the
last segment's slope beyond the last knot, s_0 below the first, 0 at a count of 0. The linear table starts
at (1, 0): the linear layers' cost at one token is part of `overhead_s` (every iteration has T >= 1, so the
two could not be told apart). The LM head table starts at (0, 0), so its first segment is the first sampled
row's cost (identified by profiled shapes that sample nothing, e.g. mid-prompt chunks). The decode table
starts at (k_0, 0) with k_0 the shortest mean KV length profiled: `decode_row_s` is a row's cost there, and
shorter rows are priced as k_0 (a row's cost below it cannot be told from the per-row constant).

Why this form:
- Measured linear-layer time against T is not a line nor a soft knee on every device. On a 2-core CPU
  (tiny model, 2 OpenMP threads) it is ~2.3 ms at T = 1 (GEMV, one thread), ~5 ms at T = 2 (GEMM: the
  second thread is woken for every operator), nearly flat to T = 16, a step between T = 128 and 129 (the
  GEMM changes its partitioning), then close to linear: no closed form with a few coefficients follows that
  (the previous sqrt(mem^2 + (per_token x T)^2) form fitted this CPU at 14% held-out error). A GPU shows a
  weight-streaming floor blending into a compute slope (a convex knee) plus tile steps. A monotone
  piecewise-linear curve with knots where the profile measured covers both, keeps the form linear in its
  parameters (the fit is a non-negative least squares: non-negative increments between knots make the curve
  monotone), and is exact at the measured token counts.
- Tile quantization stays a fitted parameter (selected among powers of two): a GPU's step at every tile
  boundary cannot be represented by knots placed only where the profile measured, but it is by evaluating
  the curves at tiled counts (Sarathi-Serve measured chunk 257 up to 32% slower than 256). A one-off step
  (the CPU's at 128/129) is a knot pair instead, with the tile left at 1.
- Attention is priced from what it does: compute ~ q(c + q/2) per segment (a varlen kernel; padded or
  dense-masked layouts arrive as segments of the padded length, so pads are paid), KV read ~ (c + q), and a
  per-segment cost. The profile CSV holds only these sums, so they enter linearly.
- Decode attention is memory-bound, but its cost per KV token is not constant: on the CPU a row reading 2048
  KV tokens cost ~30% more per token than one reading 512 (the SDPA kernel blocks the KV length), which
  left a batch x context pattern of -8%..+5% residuals with a single slope. A per-row curve of the mean KV
  length follows it (decode_kv(x) = (x - k_0) x slope when it is a line: the previous form).
  Non-linearity in the batch size lands in the linear/LM-head curves, which decode rows evaluate at
  T = r = batch size.
- Decode rows of different contexts in a ragged batch: decode_pad_kv = decode_rows x (longest context + 1)
  - decode_kv is the KV a batch padded to its longest row would read beyond its own (0 when all contexts are
  equal, and for padded layouts, whose decode_kv already counts it). An executor that batches decode rows
  into padded groups pays part of it: the profiler's (`executor/ragged.py`) groups rows within a factor 2
  of context and masks the rest, and its mixed-context decode steps took 10-20% longer than their mean
  context predicts (tiny on a 2-core CPU; fitted: ~0.6 of a KV token's cost per padding token). The fitted
  share is a property of the executor profiled (an exact varlen kernel fits it at ~0).
- A fixed overhead (launches, Python, sampling, and the linear layers at one token) absorbs everything
  independent of the batch.
- Step overheads (`step_overheads`, `costs/overheads.py`): host terms per step, per scheduled request and
  per sampled token, and an eager launch floor, added as the roofline adds them. A fit of whole profiled
  steps has them inside `overhead_s` and the per-row terms (its file has no `step_overheads`: all zero); a fit
  of operator profiles (`profiler/fit_operators.py`), whose kernels were timed without a host, takes its
  execution mode's defaults. `tp`: the tensor-parallel degree the times are per GPU of (all-reduces
  included), 1 unless written.

All coefficients are >= 0 and the curves non-decreasing, so the time never decreases when a field of the
plan grows (tile rounding is a step, never a drop). Along a decode stretch every row gains one KV token: the
mean KV length grows by one per repeat and decode_pad_kv stays the same, so `stretch_times` is a vectorised
closed form (the decode curve evaluated at k points); a stretch of a prompt's chunks (a few repeats) is priced
repeat by repeat.

KV capacity: the model carries the model shape and dtype it was fitted for, hence `kv_bytes_per_token` and
`weight_bytes`, and the device memory when the profile recorded it (`memory_bytes`, null otherwise, e.g. on
a CPU whose meta.json did not say). `kv_capacity_tokens(memory_bytes=None, ...)` sizes the cache as the
roofline does: memory x utilization - weights - activation reserve, over KV bytes per token; a caller with no
recorded memory passes it (a CLI option), or keeps using the Roofline/catalogue for capacity.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from catalogue.gpus import GiB
from catalogue.models import ModelSpec
from common.errors import InputError
from costs.base import CostModel, tiled
from costs.curves import Curve, CurveTables, check_knots, is_finite_number, pwl_array, tiled_array
from costs.features import decode_pad_kv
from costs.overheads import StepOverheads
from costs.roofline import DEFAULT_ACTIVATION_RESERVE_BYTES, DEFAULT_GPU_MEMORY_UTILIZATION
from policies.plan import BatchPlan

FORMAT = "simctl.fitted-cost-model"
VERSION = 2

# The scalar coefficients, in the order the fit and `predict_arrays` use.
COEFFICIENTS: tuple[str, ...] = (
    "overhead_s",  # s per iteration (the linear layers at T = 1 included)
    "attn_unit_s",  # s per q (c + q/2) of prefill segments
    "attn_kv_token_s",  # s per (c + q) of prefill segments
    "attn_segment_s",  # s per prefill segment
    "decode_pad_token_s",  # s per KV token of padding to the longest decode row (ragged layouts)
    "decode_row_s",  # s per decode row (reading one KV token)
)
# The piecewise-linear curves: name -> (what their n counts, the first knot's n; None: the smallest n
# profiled)
CURVES: dict[str, tuple[str, int | None]] = {
    "linear": ("tiled linear tokens T", 1),
    "lm_head": ("tiled sampled rows r", 0),
    "decode_kv": ("mean KV tokens per decode row, decode_kv / decode_rows", None),
}

FORM = ("t = overhead_s + linear(tiled(T))[T>0] + lm_head(tiled(r))[r>0] + attn_unit_s*sum q(c+q/2) "
        "+ attn_kv_token_s*sum(c+q) + attn_segment_s*segments "
        "+ decode_rows*(decode_row_s + decode_kv(decode_kv/decode_rows)) + decode_pad_token_s*decode_pad_kv; "
        "decode_pad_kv = decode_rows*(longest decode context+1) - decode_kv (ragged layouts; 0 padded); "
        "linear, lm_head, decode_kv: monotone piecewise-linear through their knots (last slope beyond the "
        "last knot); tiled(n) = n if n <= tile else ceil(n/tile)*tile")

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


def predict_arrays(coef: dict[str, float] | np.ndarray, curves: dict[str, Sequence[tuple[float, float]]],
                   tile: int, linear_tokens, sampled_tokens, attn_units, attn_kv_tokens, num_segments,
                   decode_rows, decode_kv, decode_pad_kv=0) -> np.ndarray:
    """The functional form over arrays of plan fields (the fit and reports use it; `Fitted` prices the same
    formula one plan at a time). `curves`: the knot tables by name (`CURVES`)."""
    c = (np.array([coef[k] for k in COEFFICIENTS], dtype=np.float64) if isinstance(coef, dict)
         else np.asarray(coef, dtype=np.float64))
    T = tiled_array(linear_tokens, tile)
    r = tiled_array(sampled_tokens, tile)
    rows = np.asarray(decode_rows, dtype=np.float64)
    mean_kv = np.asarray(decode_kv, dtype=np.float64) / np.maximum(rows, 1.0)
    return (c[0] + pwl_array(T, curves["linear"]) + pwl_array(r, curves["lm_head"])
            + c[1] * np.asarray(attn_units, dtype=np.float64)
            + c[2] * np.asarray(attn_kv_tokens, dtype=np.float64)
            + c[3] * np.asarray(num_segments, dtype=np.float64)
            + c[4] * np.asarray(decode_pad_kv, dtype=np.float64)
            + rows * (c[5] + pwl_array(mean_kv, curves["decode_kv"])))


class Fitted(CurveTables, CostModel):
    """Prices a `BatchPlan` with coefficients and curves fitted to a profile (see the module docstring)."""

    def __init__(self, coefficients: dict[str, float], tile: int,
                 curves: dict[str, Sequence[Sequence[float]]], model: str | None = None,
                 model_shape: dict[str, Any] | None = None, dtype_bytes: int | None = None,
                 memory_bytes: int | None = None, meta: dict[str, Any] | None = None,
                 fit: dict[str, Any] | None = None, step_overheads: StepOverheads | None = None,
                 tp: int = 1) -> None:
        if not isinstance(coefficients, dict):
            raise InputError("coefficients must be an object")
        missing = [k for k in COEFFICIENTS if k not in coefficients]
        if missing:
            raise InputError(f"coefficients lack {', '.join(missing)}")
        for k in COEFFICIENTS:
            v = coefficients[k]
            if not is_finite_number(v) or not math.isfinite(v):
                raise InputError(f"coefficient {k} must be a finite number, got {v!r}")
            if v < 0:
                raise InputError(f"coefficient {k} must be >= 0, got {v!r}")
        if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
            raise InputError(f"tile must be a positive integer, got {tile!r}")
        if not isinstance(curves, dict):
            raise InputError("curves must be an object of knot tables")
        missing = [k for k in CURVES if k not in curves]
        if missing:
            raise InputError(f"curves lack {', '.join(missing)}")
        if memory_bytes is not None and (not is_finite_number(memory_bytes) or not memory_bytes > 0
                                         or not math.isfinite(memory_bytes)):
            raise InputError(f"memory_bytes must be a positive number or null, got {memory_bytes!r}")
        if dtype_bytes is not None:
            dtype_bytes = dtype_bytes_of(dtype_bytes)
        if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
            raise InputError(f"tp must be a positive integer, got {tp!r}")
        self.tp = tp
        self.step_overheads = step_overheads
        steps = step_overheads or StepOverheads(iteration_s=0.0)
        self._steps, self._floor = steps, steps.launch_floor_s
        self.coefficients = {k: float(coefficients[k]) for k in COEFFICIENTS}
        self.tile = tile
        self.curves = {k: check_knots(k, curves[k], first) for k, (_, first) in CURVES.items()}
        if self.curves["decode_kv"][0][0] < 1 or self.curves["decode_kv"][0][1] != 0:
            raise InputError("decode_kv: the first knot must be at n >= 1 with 0 seconds")
        self.model = model
        self.model_shape = dict(model_shape) if model_shape is not None else None
        self.spec = model_spec_from_shape(model or "fitted", model_shape) if model_shape is not None else None
        self.dtype_bytes = dtype_bytes
        self.memory_bytes = int(memory_bytes) if memory_bytes is not None else None
        self.meta = dict(meta or {})
        self.fit = dict(fit or {})

        c = self.coefficients
        self._ovh = c["overhead_s"]
        self._lin = Curve(self.curves["linear"])
        self._lm = Curve(self.curves["lm_head"])
        self._dec = Curve(self.curves["decode_kv"])
        self._dec_knots = self.curves["decode_kv"]
        self._pa_unit = c["attn_unit_s"]
        self._pa_kv = c["attn_kv_token_s"]
        self._pa_seg = c["attn_segment_s"]
        self._dpad = c["decode_pad_token_s"]
        self._drow = c["decode_row_s"]

    def __repr__(self) -> str:
        dev = self.meta.get("device_name") or self.meta.get("device") or "?"
        return f"Fitted({self.model}, {dev}, tile={self.tile}, tp={self.tp})"

    def assumptions(self) -> dict[str, Any]:
        """What the model assumed beyond its curves (`simctl list`, summary.json)."""
        steps = (self.step_overheads.to_json() if self.step_overheads is not None else
                 {"source": "measured: the fitted overhead_s holds the per-step host cost, the per-row terms "
                            "the per-request and per-token costs"})
        return {"kind": "fitted", "tp": self.tp, "overhead_s": self._ovh, "step_overheads": steps,
                **({"attention": self.fit["attention"]} if "attention" in self.fit else {})}

    # ---- pricing ---------------------------------------------------------------------------------------
    def tiled(self, n: int) -> int:
        return tiled(n, self.tile)

    def _fixed(self, plan: BatchPlan, terms: dict[str, float] | None = None, repeat: int = 0) -> float:
        """The formula, written once: everything but the decode rows' KV curve (the one term a decode stretch
        changes), summed in one fixed order. `terms`, if given, receives each term (`breakdown`). `repeat` j
        prices a stretch's repeat j: each prefill segment j chunks further into its prompt."""
        t = host = self._host(plan)
        linear = lm_head = prefill = pad = 0.0
        T, r = plan.linear_tokens, plan.sampled_tokens
        if T > 0:
            linear = self._lin(tiled(T, self.tile))
            t += linear
        if r > 0:
            lm_head = self._lm(tiled(r, self.tile))
            t += lm_head
        if plan.prefill_q:
            units2 = 0  # 2 x sum q (c + q/2), exact in integers (q (c + q) for dense blocks)
            kv = 0
            full = 2 if plan.dense_attention else 1
            for q, c in zip(plan.prefill_q, plan.prefill_c):
                c += repeat * q
                units2 += q * (2 * c + full * q)
                kv += c + q
            prefill = self._pa_unit * (0.5 * units2) + self._pa_kv * kv + self._pa_seg * len(plan.prefill_q)
            t += prefill
        if self._dpad and plan.decode_rows > 1:
            pad = self._dpad * decode_pad_kv(plan)
            t += pad
        rows = self._drow * plan.decode_rows
        if terms is not None:
            terms.update(overhead=host, linear=linear, lm_head=lm_head, prefill_attention=prefill,
                         decode_attention=rows + pad)
        return t + rows

    def _host(self, plan: BatchPlan) -> float:
        """overhead_s and the step overheads (terms that are 0 add nothing, so older fits price as before)."""
        return self._ovh + self._steps.host(len(plan.seqs), plan.sampled_tokens)

    def _floored(self, plan: BatchPlan, t: float | np.ndarray) -> float | np.ndarray:
        """Eager execution: the GPU terms (all but the host's step overheads) take at least the launch
        floor."""
        if not self._floor:
            return t
        host = self._steps.host(len(plan.seqs), plan.sampled_tokens)
        return np.maximum(t, host + self._floor) if isinstance(t, np.ndarray) else max(t, host + self._floor)

    def iteration_time(self, plan: BatchPlan) -> float:
        if plan.streams:
            raise InputError("a fitted cost model prices one stream at a time (its profile never ran two "
                             "at once): price overlapped plans (--overlap 1) with the roofline")
        rows = plan.decode_rows
        if rows <= 0:
            t = self._fixed(plan)
        else:
            t = self._fixed(plan) + rows * self._dec(plan.decode_kv / rows)
        return self._floored(plan, t) if self._floor else t

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        if k <= 0:
            return np.empty(0)
        rows = plan.decode_rows
        if plan.prefill_q:  # a prompt's chunks: a few repeats, each priced as its iteration would be
            if rows <= 0:
                times = np.array([self._fixed(plan, repeat=j) for j in range(k)])
            else:
                times = np.array([self._fixed(plan, repeat=j)
                                  + rows * self._dec((plan.decode_kv + j * rows) / rows)
                                  for j in range(k)])
        else:
            fixed = self._fixed(plan)
            if rows <= 0:
                times = np.full(k, fixed)
            else:
                mean_kv = plan.decode_kv / rows + np.arange(k, dtype=np.float64)  # every row gains one token
                times = fixed + rows * pwl_array(mean_kv, self._dec_knots)
        return self._floored(plan, times)

    def breakdown(self, plan: BatchPlan) -> dict[str, float]:
        """The terms of `iteration_time(plan)` in seconds (reports and tests; not on the hot path)."""
        terms: dict[str, float] = {}
        self._fixed(plan, terms)
        n = plan.decode_rows
        if n > 0:
            terms["decode_attention"] += n * self._dec(plan.decode_kv / n)
        terms["launch_floor"] = float(self._floored(plan, sum(terms.values()))) - sum(terms.values())
        return terms

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
                      "intermediate_size", "vocab_size", "mlp", "moe"):
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
            "curves": {k: [[n, s] for n, s in v] for k, v in self.curves.items()},
            "fit": self.fit,
            **({"step_overheads": self.step_overheads.to_json(), "tp": self.tp}
               if self.step_overheads is not None else {}),
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Fitted:
        if not isinstance(data, dict):
            raise InputError("not a JSON object")
        if data.get("format") != FORMAT:
            raise InputError(f"not a fitted cost model (format is {data.get('format')!r}, "
                             f"expected {FORMAT!r})")
        if data.get("version") != VERSION:
            raise InputError(f"unsupported version {data.get('version')!r} (this simctl reads {VERSION}; "
                             f"fit the profile again with `simctl fit`)")
        required = ("model", "model_shape", "dtype_bytes", "tile", "coefficients", "curves")
        missing = [k for k in required if k not in data]
        if missing:
            raise InputError(f"missing key(s) {', '.join(missing)}")
        model = data["model"]
        if model is not None and not isinstance(model, str):
            raise InputError(f"model must be a string, got {model!r}")
        return cls(data["coefficients"], data["tile"], data["curves"], model=model,
                   model_shape=data["model_shape"], dtype_bytes=data["dtype_bytes"],
                   memory_bytes=data.get("memory_bytes"), meta=data.get("meta") or {},
                   fit=data.get("fit") or {},
                   step_overheads=(StepOverheads.from_json(data["step_overheads"])
                                   if data.get("step_overheads") is not None else None),
                   tp=data.get("tp", 1))

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
