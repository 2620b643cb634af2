"""Fit a cost model to a profile: `profiles/NAME/{profile.csv, meta.json}` -> `cost_model.json` + `fit.png`.

    report = fit_profile("profiles/tiny-cpu")            # writes cost_model.json and fit.png next to it
    print(format_report(report))
    cost = Fitted.load(report.cost_model_path)            # a CostModel for the simulator

The functional form is `sim.cost.fitted`'s (see its docstring): scalar coefficients and three monotone
piecewise-linear curves (the linear layers over tiled T, the LM head over tiled r, a decode row's attention
over its KV length). The fit:

1. Split the rows: a seeded random `holdout` share of each kind is held out (stratified by kind; every kind
   keeps at least one training row); everything is fitted on the rest and the held-out rows measure it.
2. For every candidate tile (1, 2, 4, ..., 256), on the tiled counts of the training rows:
   - knots (`choose_knots`): where the profile measured, at the resolution that matters -- every power of
     two present, 3 x 2^(k-1) present, and the smallest count present in (2^k, 1.25 x 2^k] (the row just
     past a power of two, so a step there, such as the CPU's at 128 -> 129, sits between two knots), plus
     the first knot (T = 1; r = 0; the shortest mean KV length of a decode row). Counts between knots are
     interpolated, beyond the last knot the last slope continues. Knots only where there are rows keep
     every segment pinned by measurements (knots at every measured count fitted the training rows better
     and the held-out ones no better);
   - the form is then linear in its parameters (scalars, and the curves' non-negative increments between
     knots; the decode curve's columns are multiplied by the decode rows), so one non-negative least
     squares (scipy `nnls`) on relative residuals, (predicted - measured) / measured, solves it: a 2 ms
     decode weighs as much as a 2 s prefill, and the curves come out non-decreasing. (A robust loss, IRLS
     towards L1, and weights from each row's measured spread changed the held-out error by < 0.1 point on
     real profiles: the plain least squares stays.)
3. The tile with the lowest training error wins, unless a smaller tile fits as well within noise: a tile
   step is one more parameter, so the smallest tile whose error exceeds the best by less than
   `TILE_CHI2` (10.83, chi-square with 1 degree of freedom at p = 0.001) times the noise variance
   (best SSE / (n - p)) is kept. Noise-free data thus gets the exact tile, and noisy CPU timings with no
   tile effect get tile 1 (no quantization) rather than a tile that fits the noise.
4. A coefficient whose feature is zero in every training row (e.g. no decode rows profiled) cannot be fitted;
   it is set to 0 and listed in `not_covered`. When no training row samples nothing (r = 0), the LM head's
   first row cannot be told from the overhead and is left in it (lm_head(1) = 0). At counts that only decode
   rows have (T = r = batch size) only the sum of the two curves is determined; the grid times single
   prompts at the decode batch sizes so that the linear curve is pinned there too.

`roofline_gpu` additionally calibrates `Roofline(model, gpu)`'s efficiencies (mfu, mbu = attn_mbu, attn_mfu)
in (0, 1] and its overhead_s >= 0 to the same training rows (least squares on relative error, with the
profile's fitted tile) and writes them to `roofline_calibration.json`, so a profile of one device can price a
similar one: `Roofline(model, other_gpu, **load_roofline_calibration(path))`.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import least_squares, nnls

from common.errors import InputError
from policies.plan import BatchPlan, Layout
from policies.seq import Seq
from sim.cost.calibration import CALIBRATION_FORMAT, ROOFLINE_PARAMS, load_roofline_calibration
from sim.cost.fitted import (
    COEFFICIENTS,
    CURVES,
    CurveTables,
    Fitted,
    dtype_bytes_of,
    model_spec_from_shape,
    predict_arrays,
    tiled_array,
)
from sim.cost.roofline import Roofline
from sim.gpus import get_gpu
from sim.output import atomic_write, check_out_dir, json_text, prepare_out_dir

PROFILE_COLUMNS: tuple[str, ...] = (
    "kind", "batch_size", "linear_tokens", "sampled_tokens", "num_segments", "attn_units", "attn_kv_tokens",
    "decode_rows", "decode_kv", "decode_pad_kv", "q", "c", "reps", "time_s", "time_p10_s", "time_p90_s",
)
NUMERIC_COLUMNS = PROFILE_COLUMNS[1:]
# Columns a profile may lack (written by an older profiler): derived in `load_profile`.
OPTIONAL_COLUMNS: tuple[str, ...] = ("decode_pad_kv",)
TILE_CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TILE_CHI2 = 10.83  # chi-square(1 dof) at p = 0.001: how much a tile step must lower the error to be believed
COST_MODEL_FILE, PLOT_FILE, CALIBRATION_FILE = "cost_model.json", "fit.png", "roofline_calibration.json"

# The plan fields a row is priced from.
_FEATURES = ("linear_tokens", "sampled_tokens", "attn_units", "attn_kv_tokens", "num_segments", "decode_rows",
             "decode_kv", "decode_pad_kv")


# ---- results -----------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ErrorStats:
    """Absolute percentage errors of one group of rows, as fractions (0.01 = 1%)."""

    n: int
    mape: float
    p95: float

    def to_json(self) -> dict[str, float]:
        return {"n": self.n, "mape": self.mape, "p95_ape": self.p95}


@dataclass
class RooflineCalibration:
    gpu: str
    params: dict[str, float]  # mfu, mbu (= attn_mbu), attn_mfu, overhead_s
    tile: int
    at_bound: list[str]
    holdout: dict[str, ErrorStats]
    train: dict[str, ErrorStats]
    path: Path | None = None


@dataclass
class FitReport(CurveTables):
    profile_dir: Path
    model: str
    device: str
    tile: int
    coefficients: dict[str, float]
    curves: dict[str, list[tuple[int, float]]]  # knot tables (n, seconds) by name, as `sim.cost.fitted.CURVES`
    stderr: dict[str, float]  # linearised standard error of each coefficient (inf: not identifiable)
    holdout: dict[str, ErrorStats]  # per kind and "overall"; empty when holdout=0
    train: dict[str, ErrorStats]
    tile_errors: dict[int, float]  # training RMS relative error of the best fit at each candidate tile
    not_covered: list[str]
    rows: int
    train_rows: int
    holdout_rows: int
    cost_model_path: Path
    plot_path: Path | None = None
    roofline: RooflineCalibration | None = None


# ---- reading a profile -------------------------------------------------------------------------------------
def load_profile(profile_dir: str | Path) -> tuple[pd.DataFrame, dict[str, Any]]:
    """profile.csv as a validated frame and meta.json as a dict; InputError (one line, naming the file)."""
    d = Path(profile_dir)
    if not d.is_dir():
        raise InputError(f"profile {d}: no such directory")
    csv, meta_path = d / "profile.csv", d / "meta.json"
    for p in (csv, meta_path):
        if not p.is_file():
            raise InputError(f"profile {d}: {p.name} is missing")
    try:
        df = pd.read_csv(csv, dtype={"kind": str}, keep_default_na=False, na_values=[""])
    except pd.errors.EmptyDataError:
        raise InputError(f"profile {csv}: empty file") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as e:
        raise InputError(f"profile {csv}: cannot parse ({str(e).strip().splitlines()[0]})") from None
    if "decode_pad_kv" not in df.columns and {"kind", "decode_rows", "decode_kv", "c"} <= set(df.columns):
        # an older profile: its ragged decode rows give their longest context as c (hybrids' decode rows all
        # had one context: no padding)
        rows, kv, c = (pd.to_numeric(df[k], errors="coerce") for k in ("decode_rows", "decode_kv", "c"))
        df["decode_pad_kv"] = np.where(df["kind"].astype(str).str.strip() == "decode",
                                       np.maximum(rows * (c + 1) - kv, 0), 0)
    missing = [c for c in PROFILE_COLUMNS if c not in df.columns]
    if missing:
        raise InputError(f"profile {csv}: missing column(s) {', '.join(missing)}")
    if df.empty:
        raise InputError(f"profile {csv}: no rows")
    df = df[list(PROFILE_COLUMNS)].copy()
    kinds = df["kind"].astype(str).str.strip()
    bad = kinds.eq("") | df["kind"].isna()
    if bad.any():
        raise InputError(f"profile {csv}: line {int(np.argmax(bad.to_numpy())) + 2}: empty kind")
    df["kind"] = kinds
    for col in NUMERIC_COLUMNS:
        raw = df[col]
        num = pd.to_numeric(raw, errors="coerce").astype(np.float64)
        bad = ~np.isfinite(num.to_numpy())
        if bad.any():
            i = int(np.argmax(bad))
            raise InputError(f"profile {csv}: line {i + 2}: {col} = {raw.iloc[i]!r} is not a finite number")
        low = 0.0 if col not in ("time_s", "reps") else None
        if low is not None:
            neg = num.to_numpy() < low
            if neg.any():
                i = int(np.argmax(neg))
                raise InputError(f"profile {csv}: line {i + 2}: {col} = {raw.iloc[i]!r} is negative")
        else:
            nonpos = num.to_numpy() <= 0
            if nonpos.any():
                i = int(np.argmax(nonpos))
                raise InputError(f"profile {csv}: line {i + 2}: {col} = {raw.iloc[i]!r} must be > 0")
        df[col] = num
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise InputError(f"profile {meta_path}: not valid JSON ({e})") from None
    if not isinstance(meta, dict):
        raise InputError(f"profile {meta_path}: not a JSON object")
    for key in ("model", "model_shape", "dtype"):
        if key not in meta:
            raise InputError(f"profile {meta_path}: missing key {key!r}")
    if not isinstance(meta["model"], str) or not meta["model"]:
        raise InputError(f"profile {meta_path}: model must be a non-empty string")
    try:
        model_spec_from_shape(meta["model"], meta["model_shape"])
        dtype_bytes_of(meta["dtype"])
    except InputError as e:
        raise InputError(f"profile {meta_path}: {e}") from None
    return df, meta


def split_holdout(kinds: np.ndarray, holdout: float, seed: int) -> np.ndarray:
    """Boolean mask of held-out rows: round(holdout x n) random rows of each kind (seeded), leaving every kind
    at least one training row."""
    rng = np.random.default_rng(seed)
    mask = np.zeros(len(kinds), dtype=bool)
    for kind in sorted(set(kinds.tolist())):
        idx = np.flatnonzero(kinds == kind)
        n = min(round(holdout * len(idx)), len(idx) - 1)
        if n > 0:
            mask[rng.permutation(idx)[:n]] = True
    return mask


# ---- the fit -----------------------------------------------------------------------------------------------
def _arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
    return {c: df[c].to_numpy(dtype=np.float64) for c in (*_FEATURES, "time_s")}


def predict(fit: CoefficientFit | Fitted, df: pd.DataFrame) -> np.ndarray:
    """Predicted seconds of each profile row."""
    a = _arrays(df)
    return predict_arrays(fit.coefficients, fit.curves, fit.tile, a["linear_tokens"], a["sampled_tokens"],
                          a["attn_units"], a["attn_kv_tokens"], a["num_segments"], a["decode_rows"],
                          a["decode_kv"], a["decode_pad_kv"])


def choose_knots(counts: np.ndarray, first: int) -> list[int]:
    """Knots of a curve over the (tiled) counts the training rows have: `first`, then among the counts
    present, every power of two 2^k, 3 x 2^(k-1), and the smallest count in (2^k, 1.25 x 2^k] (the row just
    past a power of two: a step there, e.g. a tile boundary or a kernel switch, shows between the two)."""
    present = sorted({int(v) for v in counts if v > first})
    knots = {first}
    if not present:
        return [first]
    have = set(present)
    p = 1
    while p <= present[-1]:
        knots.update(v for v in (p, 3 * p // 2) if v in have)
        above = [v for v in present if p < v <= 1.25 * p]
        if above:
            knots.add(above[0])
        p *= 2
    return sorted(knots)


def ramp_columns(x: np.ndarray, knots: list[int]) -> np.ndarray:
    """Design columns of a monotone piecewise-linear curve through `knots` with value 0 at knots[0]: column j
    rises from 0 to 1 between knots j and j+1 (the last one keeps rising beyond), so the curve is
    `columns @ increments` with increments >= 0 (n x len(knots) - 1)."""
    cols = []
    for j, (k0, k1) in enumerate(pairwise(knots)):
        u = (x - k0) / (k1 - k0)
        cols.append(np.clip(u, 0.0, None if j == len(knots) - 2 else 1.0))
    return np.column_stack(cols) if cols else np.zeros((len(x), 0))


@dataclass
class CoefficientFit(CurveTables):
    tile: int
    coefficients: dict[str, float]
    curves: dict[str, list[tuple[int, float]]]  # knot tables (n, seconds) by name, as `sim.cost.fitted.CURVES`
    stderr: dict[str, float]  # standard error of each scalar coefficient (0 for those not covered)
    tile_errors: dict[int, float]  # training RMS relative error of the best fit at each candidate tile
    not_covered: list[str]


@dataclass
class _TileFit:
    sse: float
    x: np.ndarray  # all parameters: scalars (COEFFICIENTS order), then each curve's increments (CURVES order)
    A: np.ndarray  # design matrix (seconds per unit of each parameter), rows x parameters
    use: np.ndarray  # parameters the rows can determine
    knots: dict[str, list[int]]


# the scalar coefficients' features, after the overhead's (a column of ones), in COEFFICIENTS order
_SCALAR_FEATURES = ("attn_units", "attn_kv_tokens", "num_segments", "decode_pad_kv", "decode_rows")


def _fit_tile(a: dict[str, np.ndarray], tile: int) -> _TileFit:
    """Non-negative least squares of the relative residuals (predicted / measured - 1) at one tile."""
    y = a["time_s"]
    rows = a["decode_rows"]
    x = {"linear": tiled_array(a["linear_tokens"], tile), "lm_head": tiled_array(a["sampled_tokens"], tile),
         "decode_kv": a["decode_kv"] / np.maximum(rows, 1.0)}
    weight = {"linear": 1.0, "lm_head": 1.0, "decode_kv": rows}  # the decode curve is paid per decode row
    present = {"linear": x["linear"] > 0, "lm_head": x["lm_head"] > 0, "decode_kv": rows > 0}
    # first knots: T = 1, r = 0, and the shortest mean KV length of the decode rows (below it a decode row's
    # cost is its per-row constant: the two cannot be told apart)
    first = {k: CURVES[k][1] if CURVES[k][1] is not None
             else int(max(1.0, x[k][present[k]].min())) if present[k].any() else 1 for k in CURVES}
    knots = {k: choose_knots(x[k][present[k]], first[k]) for k in CURVES}
    scal = np.column_stack([np.ones_like(y), *(a[f] for f in _SCALAR_FEATURES)])
    blocks = [ramp_columns(x[k], knots[k]) * np.asarray(weight[k], dtype=np.float64).reshape(-1, 1)
              for k in CURVES]
    A = np.column_stack([scal, *blocks])
    use = np.abs(A).max(axis=0) > 0
    if not (x["lm_head"] == 0).any() and blocks[1].shape[1]:
        # no row samples nothing: the LM head's first row cannot be told from the overhead (left in it)
        use[scal.shape[1] + blocks[0].shape[1]] = False
    R = A / y[:, None]
    scale = np.where(use, np.abs(R).max(axis=0), 1.0)
    scale[scale == 0] = 1.0
    sol, _ = nnls(R[:, use] / scale[use], np.ones_like(y), maxiter=100 * A.shape[1])
    p = np.zeros(A.shape[1])
    p[use] = sol / scale[use]
    res = R @ p - 1.0
    return _TileFit(float(res @ res), p, A, use, knots)


def _stderr(f: _TileFit, y: np.ndarray) -> np.ndarray:
    """Standard errors of all parameters (seconds units): s^2 (J'J)^-1 with s^2 = SSE / (n - p), the usual
    linearised estimate, conditional on the tile and the knots, ignoring the bounds. inf for a parameter the
    rows cannot tell apart from others (a component in the null space of J), or when there are no spare
    rows."""
    J = f.A[:, f.use] / y[:, None]
    n, p = J.shape
    se = np.zeros(f.A.shape[1])
    if n <= p:
        se[f.use] = math.inf
        return se
    colscale = np.abs(J).max(axis=0)
    colscale[colscale == 0] = 1.0
    _, sv, Vt = np.linalg.svd(J / colscale, full_matrices=False)
    ok = sv > sv.max(initial=0.0) * 1e-9
    s2 = f.sse / (n - p)
    V = Vt.T
    var = (V[:, ok] ** 2) @ (1.0 / sv[ok] ** 2) * s2
    unidentified = (V[:, ~ok] ** 2).sum(axis=1) > 1e-6
    se[f.use] = np.where(unidentified, math.inf, np.sqrt(var)) / colscale
    return se


def fit_coefficients(df: pd.DataFrame, tiles: tuple[int, ...] = TILE_CANDIDATES) -> CoefficientFit:
    """Fit the functional form to profile rows (see the module docstring)."""
    a = _arrays(df)
    n = len(df)
    results = {tile: _fit_tile(a, tile) for tile in tiles}
    best_err = min(f.sse for f in results.values())
    best = min(results.values(), key=lambda f: f.sse)
    # noise variance at the best tile; a larger tile is kept only if it explains the data beyond noise
    s2 = best_err / max(n - int(best.use.sum()), 1)
    slack = max(TILE_CHI2 * s2, 1e-9 * best_err, 1e-300)
    tile = min(t for t, f in results.items() if f.sse - best_err <= slack)
    f = results[tile]
    se = _stderr(f, a["time_s"])
    ns = len(COEFFICIENTS)
    curves, at = {}, ns
    for k in CURVES:
        m = len(f.knots[k]) - 1
        values = np.concatenate([[0.0], np.cumsum(f.x[at:at + m])])
        curves[k] = [(int(n), float(v)) for n, v in zip(f.knots[k], values)]
        at += m
    covered = f.use[:ns] | (np.arange(ns) == 0)
    return CoefficientFit(
        tile,
        {k: float(v) for k, v in zip(COEFFICIENTS, f.x[:ns])},
        curves,
        {k: float(v) for k, v in zip(COEFFICIENTS, se[:ns])},
        {t: math.sqrt(r.sse / n) for t, r in results.items()},
        [k for k, c in zip(COEFFICIENTS, covered) if not c],
    )


def error_stats(kinds: np.ndarray, predicted: np.ndarray, measured: np.ndarray) -> dict[str, ErrorStats]:
    """MAPE and P95 absolute percentage error per kind and "overall" (kinds with no rows are left out)."""
    ape = np.abs(predicted - measured) / measured
    out: dict[str, ErrorStats] = {}
    for kind in sorted(set(kinds.tolist())):
        m = kinds == kind
        out[kind] = ErrorStats(int(m.sum()), float(ape[m].mean()), float(np.percentile(ape[m], 95)))
    if len(ape):
        out["overall"] = ErrorStats(len(ape), float(ape.mean()), float(np.percentile(ape, 95)))
    return out


# ---- the roofline calibration ------------------------------------------------------------------------------
def plans_from_rows(df: pd.DataFrame) -> list[BatchPlan]:
    """A `BatchPlan` per profile row with its shape fields. Prefill segments are rebuilt as `num_segments`
    equal segments (q, c) with the row's attn_units and attn_kv_tokens: exact when the profiled segments are
    equal (a batch of equal prompts or chunks; padded rows), an equivalent otherwise. Decode rows with
    padding to the longest (decode_pad_kv > 0) come with decode sequences of contexts that give the row's
    decode_kv and decode_pad_kv (one at the longest context, the others sharing the rest)."""
    plans = []
    for row in df.itertuples(index=False):
        n = round(row.num_segments)
        qs: list[float] = []
        cs: list[float] = []
        if n > 0:
            K, U = row.attn_kv_tokens / n, row.attn_units / n  # K = c + q, U = q (c + q/2)
            q = K - math.sqrt(max(K * K - 2.0 * U, 0.0))
            qs, cs = [q] * n, [max(K - q, 0.0)] * n
        rows, kv, pad = round(row.decode_rows), round(row.decode_kv), round(getattr(row, "decode_pad_kv", 0))
        seqs: list[Seq] = []
        if pad > 0 and rows > 1:
            longest = (kv + pad) // rows - 1
            rest, k = divmod(kv - rows - longest, rows - 1)  # the other contexts: rest or rest + 1
            contexts = [longest] + [rest + (i < k) for i in range(rows - 1)]
            for i, c in enumerate(contexts):
                seqs.append(Seq(i, 0.0, max(c, 1), 1))
                seqs[-1].computed = seqs[-1].prefill_end = c
        plans.append(BatchPlan(seqs, [1] * len(seqs), Layout.PACKED, round(row.linear_tokens),
                               round(row.sampled_tokens), qs, cs,  # type: ignore[arg-type]
                               rows, kv))
    return plans


def calibrate_roofline(df: pd.DataFrame, train: np.ndarray, meta: dict[str, Any], gpu: str,
                       tile: int) -> tuple[dict[str, float], list[str], np.ndarray]:
    """Roofline efficiencies (in (0, 1]) and overhead (>= 0) fitted to the training rows.

    Returns (params, names of the parameters at a bound, predictions for every row)."""
    spec = model_spec_from_shape(meta["model"], meta["model_shape"])
    g = get_gpu(gpu)
    dtype_bytes = dtype_bytes_of(meta["dtype"])
    plans = plans_from_rows(df)
    y = df["time_s"].to_numpy(dtype=np.float64)
    ymed = float(np.median(y[train]))
    train_plans = [p for p, t in zip(plans, train) if t]
    y_train = y[train]

    def model(x: np.ndarray) -> Roofline:
        return Roofline(spec, g, dtype_bytes=dtype_bytes, mfu=float(x[0]), mbu=float(x[1]),
                        attn_mfu=float(x[2]), overhead_s=float(x[3]) * ymed, tile=tile)

    def fun(x: np.ndarray) -> np.ndarray:
        rf = model(x)
        t = np.fromiter((rf.iteration_time(p) for p in train_plans), np.float64, len(train_plans))
        return t / y_train - 1

    lb, ub = np.array([1e-4, 1e-4, 1e-4, 0.0]), np.array([1.0, 1.0, 1.0, np.inf])
    best = None
    for start in ((0.7, 0.75, 0.5), (0.3, 0.3, 0.3), (0.95, 0.95, 0.95), (0.05, 0.05, 0.05)):
        x0 = np.array([*start, 0.5 * float(y_train.min()) / ymed])
        sol = least_squares(fun, x0, bounds=(lb, ub), method="trf", x_scale=np.array([0.1, 0.1, 0.1, 0.1]),
                            diff_step=1e-7, ftol=1e-14, xtol=1e-14, gtol=1e-14, max_nfev=400)
        if best is None or sol.cost < best.cost:
            best = sol
    assert best is not None
    x = best.x
    params = {"mfu": float(x[0]), "mbu": float(x[1]), "attn_mfu": float(x[2]),
              "overhead_s": float(x[3]) * ymed}
    at_bound = [k for k, v, lo, hi in zip(ROOFLINE_PARAMS, x, lb, ub) if v <= lo * 1.001 or v >= hi * 0.999]
    rf = model(x)
    return params, at_bound, np.array([rf.iteration_time(p) for p in plans])


# ---- the plot ----------------------------------------------------------------------------------------------
_KIND_COLORS = {"prefill": "#1f77b4", "decode": "#d62728", "hybrid": "#2ca02c", "padded_prefill": "#9467bd",
                "padded_decode": "#ff7f0e"}


def _plot(path: Path, df: pd.DataFrame, pred: np.ndarray, held: np.ndarray, fitted: Fitted,
          report: FitReport) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    def log_axes(ax, axes: str = "xy") -> None:
        """Log scale with plain-number labels at 1, 2, 5 x 10^k (no overlapping minor labels)."""
        for name in axes:
            axis = ax.xaxis if name == "x" else ax.yaxis
            (ax.set_xscale if name == "x" else ax.set_yscale)("log")
            axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            axis.set_minor_formatter(NullFormatter())

    # times in milliseconds from here on
    y = df["time_s"].to_numpy(dtype=np.float64) * 1e3
    pred = pred * 1e3
    kinds = df["kind"].to_numpy()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6.2), constrained_layout=True)

    # panel 1: measured vs predicted, per kind, log-log
    lo, hi = min(y.min(), pred.min()) / 1.3, max(y.max(), pred.max()) * 1.3
    ax1.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
    ax1.fill_between([lo, hi], [lo / 1.1, hi / 1.1], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15,
                     label="±10%")
    for i, kind in enumerate(sorted(set(kinds.tolist()))):
        color = _KIND_COLORS.get(kind, f"C{i + 5}")
        m = kinds == kind
        st = report.holdout.get(kind)
        label = f"{kind} (held-out MAPE {st.mape:.1%})" if st else kind
        ax1.scatter(y[m & ~held], pred[m & ~held], s=14, color=color, alpha=0.55, lw=0, label=label)
        ax1.scatter(y[m & held], pred[m & held], s=40, facecolors="none", edgecolors=color, lw=1.3)
    ax1.scatter([], [], s=40, facecolors="none", edgecolors="black", label="held out (hollow)")
    log_axes(ax1)
    ax1.set_xlim(lo, hi)
    ax1.set_ylim(lo, hi)
    ax1.set_xlabel("measured iteration time (ms)")
    ax1.set_ylabel("predicted iteration time (ms)")
    ax1.set_title("measured vs fitted, every profiled shape")
    ax1.grid(True, which="major", alpha=0.3)
    ax1.legend(loc="upper left", fontsize=9, markerscale=1.6)

    # panel 2: single-segment prefill from an empty cache (time vs tokens) and the fitted curve
    m = ((df["num_segments"] == 1) & (df["decode_rows"] == 0)
         & np.isclose(df["attn_kv_tokens"], df["linear_tokens"])).to_numpy()
    tile = fitted.tile
    if m.any():
        T = df["linear_tokens"].to_numpy()[m]
        ax2.scatter(T[~held[m]], y[m][~held[m]], s=18, color="#1f77b4", alpha=0.7, lw=0,
                    label="measured (fit)")
        ax2.scatter(T[held[m]], y[m][held[m]], s=42, facecolors="none", edgecolors="#1f77b4", lw=1.3,
                    label="measured (held out)")
        tmax = int(T.max())
        grid = np.unique(np.concatenate([np.arange(1, min(tmax, 20000) + 1),
                                         np.geomspace(1, tmax, 2000).round()])).astype(np.float64)
        sampled = np.ones_like(grid)
        curve = predict_arrays(fitted.coefficients, fitted.curves, tile, grid, sampled,
                               grid * grid / 2, grid, sampled, np.zeros_like(grid), np.zeros_like(grid)) * 1e3
        ax2.plot(grid, curve, color="black", lw=1.2, label=f"fitted (tile {tile})")
        kx = np.array([n for n, _ in fitted.linear if 1 <= n <= tmax], dtype=np.float64)
        if len(kx):
            ones = np.ones_like(kx)
            ky = predict_arrays(fitted.coefficients, fitted.curves, tile, kx, ones, kx * kx / 2,
                                kx, ones, np.zeros_like(kx), np.zeros_like(kx)) * 1e3
            ax2.plot(kx, ky, "|", color="black", ms=9, mew=1.2, label="knots of the linear-layer curve")
        log_axes(ax2)
        ax2.set_xlabel("prompt tokens T (one prompt, empty cache)")
        ax2.set_ylabel("iteration time (ms)")
        ax2.set_title(f"prefill time vs tokens; steps every {tile} tokens above {tile}" if tile > 1
                      else "prefill time vs tokens (tile 1: no periodic tile step)")
        ax2.legend(loc="lower right", fontsize=9)
        ax2.grid(True, which="major", alpha=0.3)
        if tile >= 16 and tmax > 3 * tile:
            # inset: linear zoom over a few tiles around the largest boundary with measured points
            lo_t = tile * max(1, int(np.median(T[T > tile]) // tile) - 1) if (T > tile).any() else tile
            hi_t = lo_t + 3 * tile
            ins = ax2.inset_axes((0.07, 0.5, 0.42, 0.4))
            g = np.arange(lo_t - tile // 2, hi_t + 1, dtype=np.float64)
            g = g[g >= 1]
            cz = predict_arrays(fitted.coefficients, fitted.curves, tile, g, np.ones_like(g),
                                g * g / 2, g, np.ones_like(g), np.zeros_like(g), np.zeros_like(g))
            ins.plot(g, cz * 1e3, color="black", lw=1)
            mz = (T >= g[0]) & (T <= g[-1])
            ins.scatter(T[mz], y[m][mz], s=14, color="#1f77b4")
            ins.set_title(f"zoom: T = {int(g[0])}..{int(g[-1])} (ms)", fontsize=8)
            ins.tick_params(labelsize=7)
            ins.grid(True, alpha=0.3)
    else:
        ax2.text(0.5, 0.5, "no single-prompt prefill rows in the profile", ha="center", va="center",
                 transform=ax2.transAxes)
        ax2.set_axis_off()
    ov_h = report.holdout.get("overall")
    ov = ov_h or report.train.get("overall")
    which = "held-out" if ov_h else "training"
    fig.suptitle(f"{report.model} on {report.device}: fitted cost model, {which} MAPE {ov.mape:.2%}, "
                 f"P95 {ov.p95:.2%} ({ov.n} rows); tile {tile}" if ov else report.model, fontsize=12)
    atomic_write(path, lambda p: fig.savefig(p, format="png", dpi=110))
    plt.close(fig)


# ---- the command -------------------------------------------------------------------------------------------
def fit_profile(profile_dir: str | Path, out: str | Path | None = None, holdout: float = 0.2, seed: int = 0,
                roofline_gpu: str | None = None, memory_bytes: int | None = None, plot: bool = True
                ) -> FitReport:
    """Fit `profile_dir`'s profile; write cost_model.json (+ fit.png, + roofline_calibration.json when
    `roofline_gpu` is given) into `out` (default: the profile folder). InputError on bad input."""
    if not isinstance(holdout, (int, float)) or isinstance(holdout, bool) or not 0 <= holdout < 1:
        raise InputError(f"holdout must be a fraction in [0, 1), got {holdout!r}")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed must be an integer >= 0, got {seed!r}")
    if memory_bytes is not None and not (isinstance(memory_bytes, (int, float)) and memory_bytes > 0):
        raise InputError(f"memory_bytes must be > 0, got {memory_bytes!r}")
    if roofline_gpu is not None:
        get_gpu(roofline_gpu)  # fail fast on an unknown name
    profile_dir = Path(profile_dir)
    df, meta = load_profile(profile_dir)
    out_dir = check_out_dir(Path(out) if out is not None else profile_dir)  # fail fast; created on write

    kinds = df["kind"].to_numpy()
    held = split_holdout(kinds, holdout, seed)
    train = ~held
    cf = fit_coefficients(df[train])
    tile, coef, tile_errors, not_covered = cf.tile, cf.coefficients, cf.tile_errors, cf.not_covered
    pred = predict(cf, df)
    y = df["time_s"].to_numpy(dtype=np.float64)
    ho = error_stats(kinds[held], pred[held], y[held])
    tr = error_stats(kinds[train], pred[train], y[train])

    mem = memory_bytes
    if mem is None:
        for key in ("memory_bytes", "device_memory_bytes"):
            v = meta.get(key)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                mem = v
                break
    device = str(meta.get("device_name") or meta.get("device") or "unknown device")
    fit_info = {
        "profile": str(profile_dir),
        "rows": len(df), "train_rows": int(train.sum()), "holdout_rows": int(held.sum()),
        "holdout": holdout, "seed": seed,
        "tile_candidates": list(TILE_CANDIDATES),
        "tile_train_rms": {str(t): e for t, e in tile_errors.items()},
        "not_covered": not_covered,
        "coefficient_stderr": {k: (v if math.isfinite(v) else None) for k, v in cf.stderr.items()},
        "errors": {"holdout": {k: s.to_json() for k, s in ho.items()},
                   "train": {k: s.to_json() for k, s in tr.items()}},
    }
    fitted = Fitted(coef, tile, cf.curves, model=meta["model"], model_shape=meta["model_shape"],
                    dtype_bytes=dtype_bytes_of(meta["dtype"]), memory_bytes=mem,
                    meta={k: v for k, v in meta.items() if k not in ("model", "model_shape")}, fit=fit_info)
    cost_path = out_dir / COST_MODEL_FILE
    report = FitReport(profile_dir, meta["model"], device, tile, coef, cf.curves, cf.stderr, ho, tr,
                       tile_errors, not_covered, len(df), int(train.sum()), int(held.sum()), cost_path)

    cal_text = None
    if roofline_gpu is not None:
        params, at_bound, rpred = calibrate_roofline(df, train, meta, roofline_gpu, tile)
        rho = error_stats(kinds[held], rpred[held], y[held])
        rtr = error_stats(kinds[train], rpred[train], y[train])
        cal = {
            "format": CALIBRATION_FORMAT, "version": 1, "gpu": get_gpu(roofline_gpu).name,
            "model": meta["model"],
            "dtype_bytes": dtype_bytes_of(meta["dtype"]), "tile": tile, "params": params,
            "note": "Roofline(model, gpu, mfu=, mbu=, attn_mfu=, overhead_s=) fitted to the profile; "
                    "attn_mbu = mbu",
            "at_bound": at_bound, "profile": str(profile_dir), "device": device,
            "errors": {"holdout": {k: s.to_json() for k, s in rho.items()},
                       "train": {k: s.to_json() for k, s in rtr.items()}},
        }
        cal_text = json_text(cal)
        report.roofline = RooflineCalibration(cal["gpu"], params, tile, at_bound, rho, rtr,
                                              out_dir / CALIBRATION_FILE)

    # everything computed: write the files (each atomically)
    prepare_out_dir(out_dir)
    text = json_text(fitted.to_json())
    atomic_write(cost_path, lambda p: p.write_text(text, encoding="utf-8"))
    if report.roofline is not None and cal_text is not None:
        atomic_write(report.roofline.path, lambda p: p.write_text(cal_text, encoding="utf-8"))
    if plot:
        report.plot_path = out_dir / PLOT_FILE
        _plot(report.plot_path, df, pred, held, fitted, report)
    return report


def _pct(v: float) -> str:
    return f"{100 * v:6.2f}%"


def _fmt_s(v: float) -> str:
    """Seconds in an engineering unit (ms, us, ns, ps)."""
    if not math.isfinite(v):
        return "inf"
    if v == 0:
        return "0"
    for unit, f in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6), ("ns", 1e-9)):
        if abs(v) >= f:
            return f"{v / f:.4g} {unit}"
    return f"{v / 1e-12:.4g} ps"


_UNITS = {"overhead_s": "per iteration",
          "attn_unit_s": "per q(c+q/2)", "attn_kv_token_s": "per c+q token", "attn_segment_s": "per segment",
          "decode_pad_token_s": "per KV padding token", "decode_row_s": "per decode row (1 KV)"}


def format_report(report: FitReport) -> str:
    """A plain-text table of the fit: errors per kind, tile, coefficients, files written."""
    lines = [
        (f"profile   {report.profile_dir}  ({report.rows} rows: {report.train_rows} fitted, "
         f"{report.holdout_rows} held out)"),
        f"model     {report.model} on {report.device}",
        f"tile      {report.tile}   (training RMS rel. error by tile: "
        + ", ".join(f"{t}: {100 * e:.2f}%" for t, e in report.tile_errors.items()) + ")",
        "",
        f"{'kind':<16}{'held out':>9}{'MAPE':>9}{'P95':>9}   {'fitted':>7}{'MAPE':>9}{'P95':>9}",
    ]
    kinds = [k for k in sorted(set(report.train) | set(report.holdout)) if k != "overall"] + ["overall"]
    for k in kinds:
        h, t = report.holdout.get(k), report.train.get(k)
        hs = f"{h.n:>9}{_pct(h.mape):>9}{_pct(h.p95):>9}" if h else f"{0:>9}{'-':>9}{'-':>9}"
        ts = f"{t.n:>7}{_pct(t.mape):>9}{_pct(t.p95):>9}" if t else f"{0:>7}{'-':>9}{'-':>9}"
        lines.append(f"{k:<16}{hs}   {ts}")
    lines += ["", f"{'coefficient':<20}{'value':>11}  {'':<22}{'std. error':>12}"]
    for k, v in report.coefficients.items():
        se = report.stderr.get(k, math.nan)
        if k in report.not_covered:
            note = "not covered by the profile"
        elif not math.isfinite(se):
            note = "unidentified"
        elif v > se:
            note = f"±{se / v:.2%}"
        else:
            note = f"±{_fmt_s(se)}"
        lines.append(f"{k:<20}{_fmt_s(v):>11}  {_UNITS[k]:<22}{note:>12}")
    if any(not math.isfinite(v) for v in report.stderr.values()):
        lines.append("(unidentified: the profile cannot tell this coefficient apart from others; only their "
                     "combination is determined, and predictions of shapes like the profiled ones are "
                     "unaffected)")
    for name, knots in report.curves.items():
        lines.append("")
        lines.append(f"{name} curve ({CURVES[name][0]} -> ms), {len(knots)} knots:")
        cells = [f"{n}: {v * 1e3:.4g}" for n, v in knots]
        for i in range(0, len(cells), 8):
            lines.append("  " + ", ".join(cells[i:i + 8]))
    if report.roofline is not None:
        r = report.roofline
        p = r.params
        ov = r.holdout.get("overall") or r.train.get("overall")
        lines += ["", f"roofline  {r.gpu}: mfu {p['mfu']:.4f}  mbu {p['mbu']:.4f}  "
                      f"attn_mfu {p['attn_mfu']:.4f}  "
                      f"overhead {p['overhead_s'] * 1e3:.4g} ms  (tile {r.tile})"
                      + (f"; at bound: {', '.join(r.at_bound)}" if r.at_bound else "")]
        if ov is not None:
            which = "held-out" if r.holdout.get("overall") else "training"
            lines.append(f"          calibrated roofline {which} MAPE {_pct(ov.mape).strip()}, "
                         f"P95 {_pct(ov.p95).strip()}")
    lines.append("")
    written = (report.cost_model_path, report.plot_path, report.roofline.path if report.roofline else None)
    lines.append("wrote     " + ", ".join(str(p) for p in written if p is not None))
    return "\n".join(lines)


__all__ = [
    "CALIBRATION_FILE",
    "COST_MODEL_FILE",
    "PLOT_FILE",
    "CoefficientFit",
    "ErrorStats",
    "FitReport",
    "RooflineCalibration",
    "calibrate_roofline",
    "error_stats",
    "fit_coefficients",
    "fit_profile",
    "format_report",
    "load_profile",
    "load_roofline_calibration",
    "plans_from_rows",
    "predict",
    "split_holdout",
]
