"""A cost model from operator profiles (Vidur's layout, `profiler/operator_profiles.py`): a `Fitted` whose
curves are the measured operators of one model on one GPU at one TP degree.

    report = fit_operator_profile(root, get_model("llama-2-7b"), "h100", tp=1, out="fits/h100")
    print(format_operator_report(report))    # cost_model.json written in `out`; --cost prices runs with it

- Linear operators, norms, activation, rotary, residual adds (per layer, times the layers), the embedding
  (once) and, at tp > 1, two all-reduces per layer of T x hidden x 2 bytes (interpolated in the measured
  collective, averaged over neighbouring message sizes: `smoothed_collective`) are summed at every measured
  token count into the `linear` curve, made monotone (isotonic least squares: cuBLAS's kernel choice makes
  some counts slower than larger ones, and a served batch never gets faster by growing). The curve is priced
  at the token count rounded up to the profile's grid (its `tile`: 8 tokens in Vidur's profiles), so a GEMM's
  tile steps land where they were measured; between measured counts it does not interpolate across a 64-row
  tile boundary (`tile_step_knots`: each side extrapolated within its own tile), as the kernels step there.
- Attention: fitted (`simctl.profiler.fit_coefficients`, the same form as a simctl profile's) to the measured
  kernel where the profile has one for this shape and TP degree; else the roofline's rates, added rather than
  blended (the fit's form is linear: up to sqrt(2) above the roofline where compute and KV reads are equal).
- LM head: not in the profiles: the roofline's, tabulated with its tile steps.
- Step overheads: the profiles time kernels, not steps: the execution mode's defaults
  (`costs/overheads.py`).

A seeded share of the interior token counts (and of the attention rows) is held out: the model written is
fitted without them, and the report gives its error on them per operator class.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.ndimage import uniform_filter1d
from scipy.optimize import isotonic_regression

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError
from simctl.costs.curves import pwl_array, tiled_array
from simctl.costs.fit_results import ErrorStats, error_stats
from simctl.costs.fitted import Fitted
from simctl.costs.overheads import StepOverheads
from simctl.costs.roofline import Roofline
from simctl.profiler.fit_coefficients import fit_coefficients, predict
from simctl.profiler.operator_profiles import (
    ALL_REDUCES_PER_LAYER,
    LAYER_OPERATORS,
    OperatorProfile,
    load_operator_profile,
)
from simctl.profiler.profile_data import check_holdout, split_holdout
from simctl.results.output import check_out_dir, json_text, write_files

COST_MODEL_FILE = "cost_model.json"
# the smallest M-tile (token rows) of the GEMM kernels cuBLAS runs for these shapes (CUTLASS's 64- and 128-row
# tiles): the measured curves step at its multiples, which the fit keeps (`tile_step_knots`)
GEMM_ROW_TILE = 64
DTYPE_BYTES = 2  # Vidur profiles in fp16
# message sizes of the measured collective averaged (a centred rolling mean) before the fit sums it into the
# `linear` curve: below ~1 MiB the medians at neighbouring sizes fall in two clusters that do not follow the
# size (H100 tp 2: ~8 and ~40 us; A100 tp 4: ~22 and ~60 us), so a size's expected time is its neighbours'
# mean (bench/results/roofline_vs_measured.md: the worst held-out fit, H100 tp 2, 12.6% -> 7.7% P95)
COLLECTIVE_WINDOW = 5
# operator classes reported, by the profile's operator names
CLASSES: dict[str, tuple[str, ...]] = {
    "qkv": ("attn_pre_proj",), "o": ("attn_post_proj",), "gate_up": ("mlp_up_proj",),
    "down": ("mlp_down_proj",), "norms": ("input_layernorm", "post_attention_layernorm"),
    "activation": ("mlp_act",), "rope": ("attn_rope",), "add": ("add",), "embedding": ("emb",),
}


@dataclass
class OperatorFitReport:
    profile: OperatorProfile
    model: str
    fitted: Fitted
    # per operator class, all_reduce, "iteration" (the linear curve), attention
    holdout: dict[str, ErrorStats]
    attention: str  # where the attention prices come from
    cost_model_path: Path


def iteration_seconds(p: OperatorProfile, model: ModelSpec, at: np.ndarray | None = None) -> np.ndarray:
    """Seconds of every profiled operator of one iteration (all layers; all-reduces at tp > 1; no attention,
    no LM head) at each count `at` (default: the measured counts), interpolating each measured curve."""
    x = p.tokens if at is None else np.asarray(at, dtype=np.float64)

    def op(name: str) -> np.ndarray:
        return np.interp(x, p.tokens, p.operators[name])

    t = op("emb") + model.num_layers * sum(n * op(k) for k, n in LAYER_OPERATORS.items())
    if p.allreduce is not None:
        sizes, secs = p.allreduce
        t = t + ALL_REDUCES_PER_LAYER * model.num_layers * np.interp(x * model.hidden_size * DTYPE_BYTES,
                                                                      sizes, secs)
    return t


def held_counts(n: int, holdout: float, seed: int) -> np.ndarray:
    """The fit's held-out mask over n token counts: never the first or last (the curves interpolate, they do
    not extrapolate). Public so that a study can rebuild the fit's own split (bench/fit_worst.py)."""
    held = np.zeros(n, dtype=bool)
    if n > 2:
        held[1:-1] = split_holdout(np.zeros(n - 2, dtype=np.int64), holdout, seed)
    return held


def profile_subset(p: OperatorProfile, keep: np.ndarray) -> OperatorProfile:
    """`p` at the token counts `keep` marks (e.g. the fit's training counts: `~held_counts(...)`)."""
    return OperatorProfile(**{**{f.name: getattr(p, f.name) for f in fields(p)}, "tokens": p.tokens[keep],
                              "operators": {k: v[keep] for k, v in p.operators.items()}})


def smoothed_collective(p: OperatorProfile, window: int = COLLECTIVE_WINDOW) -> OperatorProfile:
    """`p` with its all-reduce times averaged over `window` neighbouring message sizes (none: `p`)."""
    if p.allreduce is None:
        return p
    sizes, secs = p.allreduce
    return OperatorProfile(**{**{f.name: getattr(p, f.name) for f in fields(p)},
                              "allreduce": (sizes, uniform_filter1d(secs, window, mode="nearest"))})


def _lm_head_knots(rf: Roofline, params: float, top: int = 8192) -> list[tuple[int, float]]:
    """The roofline's LM head as knots: powers of two up to a tile, then each tile step (flat inside a
    tile)."""
    knots = [(0, 0.0)] + [(r, rf.gemm(params, r)) for r in (1, 2, 4, 8, 16, 32, 64) if r < rf.tile]
    for k in range(rf.tile, top + 1, rf.tile):
        if k > rf.tile:
            knots.append((k - rf.tile + 1, rf.gemm(params, k)))
        knots.append((k, rf.gemm(params, k)))
    knots.append((top + rf.tile, rf.gemm(params, top + rf.tile)))  # the slope beyond
    return knots

def tile_step_knots(tokens: np.ndarray, secs: np.ndarray, grid: int, step: int = GEMM_ROW_TILE
                    ) -> tuple[np.ndarray, np.ndarray]:
    """The measured curve with a knot on each side of every `step`-row tile boundary B (at B and at B +
    `grid`, the next priced count), each extrapolated from the measured counts of its own tile (the two
    nearest, linearly; one: flat), so that the curve steps between B and B + grid where a GEMM starts another
    row of tiles, instead of interpolating across the step (a count held out beside a boundary was priced
    ~10-20% off so). Counts up to `step` are one segment; the result is made non-decreasing."""
    t, v = np.asarray(tokens, dtype=np.float64), np.asarray(secs, dtype=np.float64)
    tile_of = np.where(t <= step, 0, np.ceil(t / step))
    kt, kv = list(t), list(v)
    for b in range(step, int(t[-1]), step):
        for x in (b, b + grid):
            same = np.flatnonzero(tile_of == (np.ceil(x / step) if x > step else 0))
            if x in t or not len(same):
                continue
            j = np.sort(same[np.argsort(np.abs(t[same] - x), kind="stable")[:2]])
            y = v[j[0]]
            if len(j) == 2:  # the line through the two
                y += (v[j[1]] - v[j[0]]) * (x - t[j[0]]) / (t[j[1]] - t[j[0]])
            kt.append(x)
            kv.append(y)
    order = np.argsort(kt, kind="stable")
    return np.asarray(kt)[order], np.maximum.accumulate(np.asarray(kv)[order])


def _attention_frame(att: pd.DataFrame, layers: int) -> pd.DataFrame:
    """Attention rows as profile rows (the columns `fit_coefficients` reads), times over all layers."""
    pre = (att["kind"] == "prefill").to_numpy()
    q, c, b = (att[k].to_numpy(dtype=np.float64) for k in ("q", "kv", "batch"))
    zero = np.zeros(len(att))
    return pd.DataFrame({
        "kind": att["kind"].to_numpy(), "linear_tokens": zero, "sampled_tokens": zero,
        "attn_units": np.where(pre, b * q * (c + q / 2), 0.0),
        "attn_kv_tokens": np.where(pre, b * (c + q), 0.0), "num_segments": np.where(pre, b, 0.0),
        "decode_rows": np.where(pre, 0.0, b), "decode_kv": np.where(pre, 0.0, b * (c + 1)),
        "decode_pad_kv": zero, "eager_step": zero,
        "time_s": att["time_s"].to_numpy(dtype=np.float64) * layers})


def fit_operator_profile(root: str | Path, model: ModelSpec, gpu: str, tp: int = 1,
                         execution: str = "cuda-graph", out: str | Path | None = None, holdout: float = 0.2,
                         seed: int = 0) -> OperatorFitReport:
    """Fit `model` on catalogue GPU `gpu` at `tp` from the operator profiles under `root`; write
    cost_model.json into `out` (required: the profile directory is not a fit's folder)."""
    if out is None:
        raise InputError("give --out: where to write the cost model fitted to the operator profiles")
    check_holdout(holdout)
    g = get_gpu(gpu)
    steps = StepOverheads.defaults(execution, model.num_layers)
    rf = Roofline(model, g, tp=tp)  # checks tp against the heads; the LM head and missing attention
    out_dir = check_out_dir(Path(out), (COST_MODEL_FILE,))
    p = load_operator_profile(root, model, g.name, tp)

    held = held_counts(len(p.tokens), holdout, seed)
    train = smoothed_collective(profile_subset(p, ~held))
    layers = LayerCurve.fit(p, train, model)
    attention = (_measured_attention(p, model.num_layers, holdout, seed) if p.attention is not None
                 else _roofline_attention(rf))
    stats = {**_layer_errors(p, train, held, model, layers), **_all_reduce_errors(p, holdout, seed),
             **attention.errors}
    fit_info = {
        "source": "operator profiles", "profile": str(Path(root)), "model_profile": p.model_dir,
        "network": p.network, "attention": attention.source, "lm_head": "roofline (not in the profiles)",
        "step_overheads": f"{execution} defaults (the profiles time kernels, not steps)",
        "tile": f"{layers.tile}: the profile's token grid", "holdout": holdout, "seed": seed,
        "train_counts": int((~held).sum()), "holdout_counts": int(held.sum()),
        "errors": {"holdout": {k: v.to_json() for k, v in stats.items()}},
    }
    meta = {"device": "cuda", "device_name": f"NVIDIA {p.model_dir.split('/')[0].upper()}",
            "dtype": "float16", "source": "operator profiles"}
    curves = {"linear": layers.knots, "lm_head": _lm_head_knots(rf, rf.lm_head_params_per_gpu),
              "decode_kv": attention.decode_knots}
    spec_fields = {f.name: getattr(model, f.name) for f in fields(model) if f.name != "description"}
    fitted = Fitted(_coefficients(layers, attention), layers.tile, curves, model=model.name,
                    model_shape=spec_fields, dtype_bytes=DTYPE_BYTES, memory_bytes=g.memory_bytes, meta=meta,
                    fit=fit_info, step_overheads=steps, tp=tp)
    text = json_text(fitted.to_json())
    write_files(out_dir, {COST_MODEL_FILE: lambda path: path.write_text(text, encoding="utf-8")}, "the fit")
    return OperatorFitReport(p, model.name, fitted, stats, attention.source, out_dir / COST_MODEL_FILE)


@dataclass(frozen=True)
class LayerCurve:
    """Every operator but attention and the LM head, as the `linear` curve: the seconds at one token (part of
    the overhead) and the knots above it, priced at the token count rounded up to `tile`."""

    one_token_s: float
    knots: list[tuple[int, float]]
    tile: int

    @classmethod
    def fit(cls, p: OperatorProfile, train: OperatorProfile, model: ModelSpec) -> LayerCurve:
        """Made monotone over the training counts; the tile is the profile's token grid."""
        s = isotonic_regression(iteration_seconds(train, model)).x
        tile = int(np.gcd.reduce(p.tokens[p.tokens >= 8])) if (p.tokens >= 8).any() else 1
        stepped = zip(*tile_step_knots(train.tokens, s, tile))
        knots = [(1, 0.0)] + [(int(n), float(v - s[0])) for n, v in stepped if n > 1]
        return cls(float(s[0]), knots, tile)

    def seconds(self, tokens: np.ndarray) -> np.ndarray:
        """The curve's price of an iteration of `tokens` token rows (each count rounded up to the tile)."""
        return self.one_token_s + pwl_array(tiled_array(tokens, self.tile), self.knots)


@dataclass(frozen=True)
class _Attention:
    """Attention's prices: its scalar coefficients, the decode curve, where they come from, and their held-out
    errors (none from the roofline)."""

    coefficients: dict[str, float]  # overhead_s, attn_unit_s, attn_kv_token_s, attn_segment_s, decode_row_s
    decode_knots: list[tuple[int, float]]
    source: str
    errors: dict[str, ErrorStats]


def _measured_attention(p: OperatorProfile, layers: int, holdout: float, seed: int) -> _Attention:
    """The form's attention terms fitted to the measured kernel (a seeded share of its rows held out)."""
    df = _attention_frame(p.attention, layers)
    kinds = df["kind"].to_numpy()
    held = split_holdout(kinds, holdout, seed)
    cf = fit_coefficients(df[~held], tiles=(1,))
    errors = {}
    if held.any():
        by_kind = error_stats(kinds[held], predict(cf, df)[held], df["time_s"].to_numpy()[held])
        errors = {f"attention_{k}": v for k, v in by_kind.items() if k != "overall"}
    return _Attention(cf.coefficients, cf.curves["decode_kv"], f"measured ({p.attention_file})", errors)


def _roofline_attention(rf: Roofline) -> _Attention:
    unit, kv, dkv = rf.attention_rates()
    coefficients = {"overhead_s": 0.0, "attn_unit_s": unit, "attn_kv_token_s": kv, "attn_segment_s": 0.0,
                    "decode_row_s": dkv}
    decode_knots = [(1, 0.0), (2, dkv)]  # rows x (dkv + (mean KV - 1) x dkv) = decode_kv x dkv
    return _Attention(coefficients, decode_knots,
                      "roofline (no attention profile of this shape, GPU and TP degree)", {})


def _coefficients(layers: LayerCurve, attention: _Attention) -> dict[str, float]:
    att = attention.coefficients
    scalars = ("attn_unit_s", "attn_kv_token_s", "attn_segment_s", "decode_row_s")
    return {"overhead_s": layers.one_token_s + att["overhead_s"], **{k: float(att[k]) for k in scalars},
            "decode_pad_token_s": 0.0}


def _layer_errors(p: OperatorProfile, train: OperatorProfile, held: np.ndarray, model: ModelSpec,
                  layers: LayerCurve) -> dict[str, ErrorStats]:
    """Held-out errors of each operator class (interpolated in the training counts) and of the whole
    iteration as the `linear` curve prices it."""
    if not held.any():
        return {}
    errors = {}
    for name, ops in CLASSES.items():
        measured = sum(p.operators[k][held] for k in ops)
        errors[name] = ErrorStats.of(sum(np.interp(p.tokens[held], train.tokens, train.operators[k])
                                         for k in ops), measured)
    errors["iteration"] = ErrorStats.of(layers.seconds(p.tokens[held]), iteration_seconds(p, model)[held])
    return errors


def _all_reduce_errors(p: OperatorProfile, holdout: float, seed: int) -> dict[str, ErrorStats]:
    """Held-out error of the all-reduce's sizes, interpolated in the others averaged as the fit averages them
    (`smoothed_collective`; none at tp = 1)."""
    if p.allreduce is None:
        return {}
    sizes, secs = p.allreduce
    h = held_counts(len(sizes), holdout, seed)
    if not h.any():
        return {}
    kept = uniform_filter1d(secs[~h], COLLECTIVE_WINDOW, mode="nearest")
    return {"all_reduce": ErrorStats.of(np.interp(sizes[h], sizes[~h], kept), secs[h])}


def format_operator_report(r: OperatorFitReport) -> str:
    f = r.fitted.fit
    lines = [(f"fitted {r.model} on {r.profile.gpu} at tp={r.profile.tp} from {r.profile.root} "
             f"(operators of {r.profile.model_dir}; {f['train_counts']} token counts, {f['holdout_counts']} "
             "held out)"),
             (f"  all-reduce: {r.profile.network or 'none (tp=1)'}; attention: {r.attention}; LM head: "
             f"roofline; tile {r.fitted.tile} (the profile's token grid)"),
             f"  step overheads: {r.fitted.step_overheads.describe() if r.fitted.step_overheads else 'none'}",
             "  held-out error (MAPE / P95):"]
    for k, v in r.holdout.items():
        lines.append(f"    {k:18s} {v.mape:6.1%} / {v.p95:6.1%}  (n={v.n})")
    lines.append(f"wrote {r.cost_model_path}")
    return "\n".join(lines)
