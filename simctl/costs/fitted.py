"""A cost model fitted to profiled iterations of one model on one device (`profiler/fit.py` writes it):
`Fitted` prices a `BatchPlan` with the functional form of `costs/fitted_form.py` (its docstring says what the
form is and why) and the coefficients and knot tables of a cost_model.json.

Along a decode stretch every row gains one KV token: the mean KV length grows by one per repeat and
decode_pad_kv stays the same, so `stretch_times` is a vectorised closed form (the decode curve evaluated at k
points); a stretch of a prompt's chunks (a few repeats) is priced repeat by repeat.

The model carries the model shape and dtype it was fitted for, hence `kv_bytes_per_token` and
`weight_bytes`, and the device memory when the profile recorded it (`memory_bytes`, null otherwise, e.g. on
a CPU whose meta.json did not say): the deployment sizes its KV cache from them (`costs/kv_capacity.py`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from simctl.catalogue.models import ModelSpec
from simctl.catalogue.recorded_model import dtype_bytes_of, model_spec_from_shape
from simctl.common.errors import InputError
from simctl.costs.base import CostModel, tiled
from simctl.costs.curves import Curve, CurveTables, check_knots, is_finite_number, pwl_array
from simctl.costs.features import decode_pad_kv
from simctl.costs.fitted_form import COEFFICIENTS, CURVES, FORM, OPTIONAL_COEFFICIENTS
from simctl.costs.graph_buckets import GraphShapes
from simctl.costs.overheads import StepOverheads
from simctl.policies.plan import BatchPlan

FORMAT = "simctl.fitted-cost-model"
VERSION = 2


class Fitted(CurveTables, CostModel):
    """Prices a `BatchPlan` with coefficients and curves fitted to a profile (see the module docstring)."""

    def __init__(self, coefficients: dict[str, float], tile: int,
                 curves: dict[str, Sequence[Sequence[float]]], model: str | None = None,
                 model_shape: dict[str, Any] | None = None, dtype_bytes: int | None = None,
                 memory_bytes: int | None = None, meta: dict[str, Any] | None = None,
                 fit: dict[str, Any] | None = None, step_overheads: StepOverheads | None = None,
                 tp: int = 1) -> None:
        self.coefficients = _checked_coefficients(coefficients)
        _check_scalars(tile, memory_bytes, tp)
        self.curves = _checked_curves(curves)
        self.tile = tile
        self.tp = tp
        self.step_overheads = step_overheads
        steps = step_overheads or StepOverheads()
        self._steps, self._floor = steps, steps.launch_floor_s
        self.model = model
        self.model_shape = dict(model_shape) if model_shape is not None else None
        self.spec = model_spec_from_shape(model or "fitted", model_shape) if model_shape is not None else None
        self.dtype_bytes = dtype_bytes_of(dtype_bytes) if dtype_bytes is not None else None
        self.memory_bytes = int(memory_bytes) if memory_bytes is not None else None
        self.meta = dict(meta or {})
        self.fit = dict(fit or {})
        # profiled with CUDA-graph decode steps: decode plans are priced as their graphs run them
        graphs = (self.meta.get("executor_config") or {}).get("cuda_graphs")
        self.graphs = GraphShapes(**graphs) if graphs else None

        c = self.coefficients
        self._ovh = c["overhead_s"]
        self._host_const = self._steps.per_request_only
        self._lin = Curve(self.curves["linear"])
        self._lm = Curve(self.curves["lm_head"])
        self._dec = Curve(self.curves["decode_kv"])
        self._dec_knots = self.curves["decode_kv"]
        self._pa_unit = c["attn_unit_s"]
        self._pa_kv = c["attn_kv_token_s"]
        self._pa_seg = c["attn_segment_s"]
        self._dpad = c["decode_pad_token_s"]
        self._drow = c["decode_row_s"]
        self._eager = c["eager_step_s"]

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

    @property
    def admission_s(self) -> float:
        return self._steps.admission_s

    # ---- pricing ---------------------------------------------------------------------------------------
    def tiled(self, n: int) -> int:
        return tiled(n, self.tile)

    def _fixed(self, plan: BatchPlan, terms: dict[str, float] | None = None, repeat: int = 0) -> float:
        """The formula, written once: everything but the decode rows' KV curve (the one term a decode stretch
        changes), summed in one fixed order. `terms`, if given, receives each term (`breakdown`). `repeat` j
        prices a stretch's repeat j: each prefill segment j chunks further into its prompt."""
        t = host = self._host(plan, repeat)
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

    def _host(self, plan: BatchPlan, repeat: int = 0) -> float:
        """overhead_s and the step overheads (terms that are 0 add nothing, so older fits price as before)."""
        if self._host_const is not None:
            step, request = self._host_const
            return self._ovh + (step + request * len(plan.seqs))  # as `of` sums them
        return self._ovh + self._steps.of(plan, repeat)

    def _floored(self, plan: BatchPlan, t: float | np.ndarray) -> float | np.ndarray:
        """Eager execution: the GPU terms (all but the host's step overheads) take at least the launch
        floor (`t`: one step's time, or a stretch's, one per repeat)."""
        if not self._floor:
            return t
        floor = self._steps.of(plan) + self._floor
        if not isinstance(t, np.ndarray):
            return max(t, floor)
        floors = np.full(len(t), self._steps.of(plan, 1) + self._floor)  # a stretch's repeats: only the first
        floors[:1] = floor  # schedules a request for the first time
        return np.maximum(t, floors)

    def _as_run(self, plan: BatchPlan) -> tuple[BatchPlan, float]:
        """`plan` as the profiled executor runs it, and its eager-step term: with decode graphs, a graphed
        step padded to its graph (no term) or any other step as it is (`eager_step_s`); without, as it is."""
        if self.graphs is None:
            return plan, 0.0
        run = self.graphs.executed(plan)
        return run, self._eager if run is plan else 0.0

    def iteration_time(self, plan: BatchPlan) -> float:
        if plan.streams:
            raise InputError("a fitted cost model prices one stream at a time (its profile never ran two "
                             "at once): price overlapped plans (--overlap 1) with the roofline")
        plan, eager = self._as_run(plan)
        rows = plan.decode_rows
        if rows <= 0:
            t = self._fixed(plan) + eager
        else:
            t = self._fixed(plan) + eager + rows * self._dec(plan.decode_kv / rows)
        return self._floored(plan, t) if self._floor else t

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        if k <= 0:
            return np.empty(0)
        run, eager = self._as_run(plan)
        if run is not plan:
            # a graphed decode stretch: B rows each reading the longest row's KV rounded up to whole blocks
            longest = max(s.computed for s in plan.seqs) + 1
            kv = self.graphs.kv(longest + np.arange(k))
            return self._floored(run, self._fixed(run) + run.decode_rows * pwl_array(kv, self._dec_knots))
        return self._floored(plan, eager + self._stretch(plan, k))

    def _stretch(self, plan: BatchPlan, k: int) -> np.ndarray:
        """`stretch_times` of a plan priced as it is, before the launch floor."""
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
        return times

    def breakdown(self, plan: BatchPlan) -> dict[str, float]:
        """The terms of `iteration_time(plan)` in seconds (reports and tests; not on the hot path)."""
        terms: dict[str, float] = {}
        if self.graphs is not None:
            plan, terms["eager_step"] = self._as_run(plan)
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


def _checked_coefficients(coefficients: Any) -> dict[str, float]:
    """Every scalar of the form (`COEFFICIENTS`), each a finite number >= 0 (InputError otherwise)."""
    if not isinstance(coefficients, dict):
        raise InputError("coefficients must be an object")
    coefficients = {**dict.fromkeys(OPTIONAL_COEFFICIENTS, 0.0), **coefficients}
    missing = [k for k in COEFFICIENTS if k not in coefficients]
    if missing:
        raise InputError(f"coefficients lack {', '.join(missing)}")
    for k in COEFFICIENTS:
        v = coefficients[k]
        if not is_finite_number(v) or not math.isfinite(v):
            raise InputError(f"coefficient {k} must be a finite number, got {v!r}")
        if v < 0:
            raise InputError(f"coefficient {k} must be >= 0, got {v!r}")
    return {k: float(coefficients[k]) for k in COEFFICIENTS}


def _checked_curves(curves: Any) -> dict[str, list[tuple[int, float]]]:
    """Every curve of the form (`CURVES`), a valid knot table starting where the form says."""
    if not isinstance(curves, dict):
        raise InputError("curves must be an object of knot tables")
    missing = [k for k in CURVES if k not in curves]
    if missing:
        raise InputError(f"curves lack {', '.join(missing)}")
    checked = {k: check_knots(k, curves[k], first) for k, (_, first) in CURVES.items()}
    if checked["decode_kv"][0][0] < 1 or checked["decode_kv"][0][1] != 0:
        raise InputError("decode_kv: the first knot must be at n >= 1 with 0 seconds")
    return checked


def _check_scalars(tile: Any, memory_bytes: Any, tp: Any) -> None:
    if not isinstance(tile, int) or isinstance(tile, bool) or tile < 1:
        raise InputError(f"tile must be a positive integer, got {tile!r}")
    if memory_bytes is not None and (not is_finite_number(memory_bytes) or not memory_bytes > 0
                                     or not math.isfinite(memory_bytes)):
        raise InputError(f"memory_bytes must be a positive number or null, got {memory_bytes!r}")
    if not isinstance(tp, int) or isinstance(tp, bool) or tp < 1:
        raise InputError(f"tp must be a positive integer, got {tp!r}")
