"""Fit a cost model to a profile: `profiles/NAME/{profile.csv, meta.json}` -> `cost_model.json` + `fit.png`.

    report = fit_profile("profiles/tiny-cpu")            # writes cost_model.json and fit.png next to it
    print(format_report(report))
    cost = Fitted.load(report.cost_model_path)            # a CostModel for the simulator

The functional form is `costs.fitted`'s (see its docstring): scalar coefficients and three monotone
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

import math
from dataclasses import dataclass
from itertools import pairwise
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from catalogue.gpus import get_gpu
from common.errors import InputError
from costs.calibration import CALIBRATION_FORMAT
from costs.curves import CurveTables, tiled_array
from costs.fit_results import ErrorStats, FitReport, RooflineCalibration
from costs.fitted import COEFFICIENTS, CURVES, Fitted, dtype_bytes_of, predict_arrays
from costs.provenance import measured_on
from executor.config import ExecutorConfig
from plots.fit import fit_figure
from profiler.fit_roofline import calibrate_roofline
from profiler.profile import PROFILE_FILES
from profiler.profile_data import load_profile, split_holdout
from profiler.vllm_served import calibrate
from results.output import check_out_dir, json_text, write_files

TILE_CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TILE_CHI2 = 10.83  # chi-square(1 dof) at p = 0.001: how much a tile step must lower the error to be believed
COST_MODEL_FILE, PLOT_FILE, CALIBRATION_FILE = "cost_model.json", "fit.png", "roofline_calibration.json"
FIT_FILES = (COST_MODEL_FILE, PLOT_FILE, CALIBRATION_FILE)

# The plan fields a row is priced from.
_FEATURES = ("linear_tokens", "sampled_tokens", "attn_units", "attn_kv_tokens", "num_segments", "decode_rows",
             "decode_kv", "decode_pad_kv")


# ---- results -----------------------------------------------------------------------------------------------


# ---- reading a profile -------------------------------------------------------------------------------------


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
    # knot tables (n, seconds) by name, as `costs.fitted.CURVES`
    curves: dict[str, list[tuple[int, float]]]
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


# ---- the command -------------------------------------------------------------------------------------------
def _profiled_memory(meta: dict) -> float | None:
    """The profiled device's memory in bytes, as the profile recorded it (older profiles: another key)."""
    for key in ("memory_bytes", "device_memory_bytes"):
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return v
    return None


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
        roofline_gpu = get_gpu(roofline_gpu).name  # fail fast on an unknown name
    profile_dir = Path(profile_dir)
    df, meta = load_profile(profile_dir)
    for what, present in (("prefill", df["num_segments"] > 0), ("decode", df["decode_rows"] > 0)):
        if not present.any():
            raise InputError(f"profile {profile_dir}: no iteration has {what} rows, so the fit could not "
                             "price them (they would cost nothing); profile again with the full or quick "
                             "grid")
    if roofline_gpu is not None and measured_on(meta) not in (None, roofline_gpu):
        raise InputError(f"--roofline-gpu {roofline_gpu}: the profile was measured on "
                         f"{meta.get('device_name') or meta.get('device')}, and a calibration relates its "
                         f"times to the specs of that device: use --roofline-gpu {measured_on(meta)}")
    out_dir = Path(out) if out is not None else profile_dir
    # fail fast, created on write; beside a profile or an earlier fit only, so that results never mix
    check_out_dir(out_dir, FIT_FILES + (PROFILE_FILES if out_dir.resolve() == profile_dir.resolve() else ()))

    kinds = df["kind"].to_numpy()
    held = split_holdout(kinds, holdout, seed)
    train = ~held
    cf = fit_coefficients(df[train])
    tile, coef, tile_errors, not_covered = cf.tile, cf.coefficients, cf.tile_errors, cf.not_covered
    pred = predict(cf, df)
    y = df["time_s"].to_numpy(dtype=np.float64)
    ho = error_stats(kinds[held], pred[held], y[held])
    tr = error_stats(kinds[train], pred[train], y[train])

    mem = memory_bytes if memory_bytes is not None else _profiled_memory(meta)
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
    # the executor whose times these are (`ExecutorConfig.of_record` reads a profile from before it was
    # recorded)
    executor = ExecutorConfig.of_record(meta).record(str(meta.get("device", "cpu")))
    fitted = Fitted(coef, tile, cf.curves, model=meta["model"], model_shape=meta["model_shape"],
                    dtype_bytes=dtype_bytes_of(meta["dtype"]), memory_bytes=mem,
                    meta={**{k: v for k, v in meta.items() if k not in ("model", "model_shape")},
                          "executor_config": executor}, fit=fit_info)
    fitted, served = calibrate(fitted, meta)  # a vLLM profile's served steps: its host terms
    if served:
        fitted.fit["served"] = served
    cost_path = out_dir / COST_MODEL_FILE
    report = FitReport(profile_dir, meta["model"], device, tile, coef, cf.curves, cf.stderr, ho, tr,
                       tile_errors, not_covered, len(df), int(train.sum()), int(held.sum()), cost_path,
                       served=served, step_overheads=fitted.step_overheads)

    cal_text = None
    if roofline_gpu is not None:
        params, at_bound, rpred = calibrate_roofline(df, train, meta, roofline_gpu, tile)
        rho = error_stats(kinds[held], rpred[held], y[held])
        rtr = error_stats(kinds[train], rpred[train], y[train])
        cal = {
            "format": CALIBRATION_FORMAT, "version": 2, "gpu": roofline_gpu, "measured_on": roofline_gpu,
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

    # everything computed: write the files, all or none
    text = json_text(fitted.to_json())
    writers = {COST_MODEL_FILE: lambda p: p.write_text(text, encoding="utf-8")}
    if cal_text is not None:
        writers[CALIBRATION_FILE] = lambda p: p.write_text(cal_text, encoding="utf-8")
    if plot:
        report.plot_path = out_dir / PLOT_FILE
        writers[PLOT_FILE] = lambda p: fit_figure(p, df, pred, held, fitted, report)
    write_files(out_dir, writers, "the fit")
    for name in FIT_FILES:  # an earlier fit's file this fit does not replace would pass for this fit's
        if name not in writers:
            (out_dir / name).unlink(missing_ok=True)
    return report
