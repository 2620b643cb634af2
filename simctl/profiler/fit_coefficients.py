"""The functional form's coefficients and curves fitted to profile rows (`fit_coefficients`; the form is
`costs/fitted_form.py`'s), and the form's prediction of each row (`predict`). The fit:

1. For every candidate tile (1, 2, 4, ..., 256), on the tiled counts of the training rows:
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
2. The tile with the lowest training error wins, unless a smaller tile fits as well within noise: a tile
   step is one more parameter, so the smallest tile whose error exceeds the best by less than
   `TILE_CHI2` (10.83, chi-square with 1 degree of freedom at p = 0.001) times the noise variance
   (best SSE / (n - p)) is kept. Noise-free data thus gets the exact tile, and noisy CPU timings with no
   tile effect get tile 1 (no quantization) rather than a tile that fits the noise.
3. A coefficient whose feature is zero in every training row (e.g. no decode rows profiled) cannot be fitted;
   it is set to 0 and listed in `not_covered`. When no training row samples nothing (r = 0), the LM head's
   first row cannot be told from the overhead and is left in it (lm_head(1) = 0). At counts that only decode
   rows have (T = r = batch size) only the sum of the two curves is determined; the grid times single
   prompts at the decode batch sizes so that the linear curve is pinned there too.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import pairwise

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from simctl.costs.curves import CurveTables, tiled_array
from simctl.costs.fitted import Fitted
from simctl.costs.fitted_form import COEFFICIENTS, CURVES, predict_arrays

TILE_CANDIDATES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TILE_CHI2 = 10.83  # chi-square(1 dof) at p = 0.001: how much a tile step must lower the error to be believed

# The plan fields a row is priced from.
_FEATURES = ("linear_tokens", "sampled_tokens", "attn_units", "attn_kv_tokens", "num_segments", "decode_rows",
             "decode_kv", "decode_pad_kv", "eager_step")


def _arrays(df: pd.DataFrame) -> dict[str, np.ndarray]:
    return {c: df[c].to_numpy(dtype=np.float64) for c in (*_FEATURES, "time_s")}


def predict(fit: CoefficientFit | Fitted, df: pd.DataFrame) -> np.ndarray:
    """Predicted seconds of each profile row."""
    a = _arrays(df)
    return predict_arrays(fit.coefficients, fit.curves, fit.tile, a["linear_tokens"], a["sampled_tokens"],
                          a["attn_units"], a["attn_kv_tokens"], a["num_segments"], a["decode_rows"],
                          a["decode_kv"], a["decode_pad_kv"], a["eager_step"])


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
    # knot tables (n, seconds) by name, as `simctl.costs.fitted_form.CURVES`
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
_SCALAR_FEATURES = ("attn_units", "attn_kv_tokens", "num_segments", "decode_pad_kv", "decode_rows",
                    "eager_step")


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
    # an eager profile has no eager_step feature to cover: the term does not apply to it (0), not unfitted
    covered = f.use[:ns] | (np.arange(ns) == 0) | ((np.array(COEFFICIENTS) == "eager_step_s")
                                                   & (a["eager_step"] == 0).all())
    return CoefficientFit(
        tile,
        {k: float(v) for k, v in zip(COEFFICIENTS, f.x[:ns])},
        curves,
        {k: float(v) for k, v in zip(COEFFICIENTS, se[:ns])},
        {t: math.sqrt(r.sse / n) for t, r in results.items()},
        [k for k, c in zip(COEFFICIENTS, covered) if not c],
    )
