"""Monotone piecewise-linear curves on knot tables, as the fitted cost model prices with them: checked on
load, evaluated over arrays (the fit) or one count at a time (pricing a plan), and tile rounding over
arrays."""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Sequence
from itertools import pairwise
from typing import Any

import numpy as np

from simctl.common.errors import InputError


def tiled_array(n: np.ndarray, tile: int) -> np.ndarray:
    """`Roofline.tiled` over an array: n up to one tile, else n rounded up to a multiple of the tile."""
    n = np.asarray(n, dtype=np.float64)
    return np.where(n <= tile, n, np.ceil(n / tile) * tile)



def is_finite_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)



def check_knots(name: str, knots: Any, first: int | None = None) -> list[tuple[int, float]]:
    """A validated knot table [(n, seconds), ...]: n integers >= 0 strictly increasing, seconds finite,
    >= 0 and non-decreasing (InputError otherwise). `first`: the n the table must start at."""
    if not isinstance(knots, (list, tuple)) or not knots:
        raise InputError(f"{name} must be a non-empty list of [n, seconds] knots")
    out: list[tuple[int, float]] = []
    for k in knots:
        if not isinstance(k, (list, tuple)) or len(k) != 2 or not all(is_finite_number(v) for v in k):
            raise InputError(f"{name}: knot {k!r} is not a pair [n, seconds]")
        n, s = k
        if not math.isfinite(n) or n != int(n) or n < 0:
            raise InputError(f"{name}: knot n = {n!r} must be an integer >= 0")
        if not math.isfinite(s) or s < 0:
            raise InputError(f"{name}: knot seconds = {s!r} must be a finite number >= 0")
        if out and n <= out[-1][0]:
            raise InputError(f"{name}: knots must have strictly increasing n ({out[-1][0]} then {int(n)})")
        if out and s < out[-1][1]:
            raise InputError(f"{name}: seconds must not decrease ({out[-1][1]!r} at n = {out[-1][0]}, then "
                             f"{s!r} at n = {int(n)})")
        out.append((int(n), float(s)))
    if first is not None and out[0][0] != first:
        raise InputError(f"{name}: the first knot must be at n = {first}, got {out[0][0]}")
    return out



def pwl_array(x: np.ndarray, knots: Sequence[tuple[float, float]]) -> np.ndarray:
    """The piecewise-linear curve through `knots` at `x` (the last slope beyond the last knot, the first
    value below the first knot); 0 where x <= 0."""
    x = np.asarray(x, dtype=np.float64)
    xs = np.array([k[0] for k in knots], dtype=np.float64)
    ys = np.array([k[1] for k in knots], dtype=np.float64)
    v = np.interp(x, xs, ys)
    if len(xs) > 1:
        slope = (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
        v = v + np.maximum(x - xs[-1], 0.0) * slope
    return np.where(x > 0, v, 0.0)



class Curve:
    """A knot table prepared for pricing one count at a time (bisect into the knots)."""

    __slots__ = ("slopes", "x0", "xs", "y0", "ys")

    def __init__(self, knots: Sequence[tuple[int, float]]) -> None:
        self.xs = [k[0] for k in knots]
        self.ys = [k[1] for k in knots]
        s = [(y1 - y0) / (x1 - x0) for (x0, y0), (x1, y1) in pairwise(knots)]
        self.slopes = s + [s[-1] if s else 0.0]  # beyond the last knot: the last segment's slope
        self.x0, self.y0 = self.xs[0], self.ys[0]

    def __call__(self, x: float) -> float:
        if x <= self.x0:
            return self.y0 if x > 0 else 0.0
        i = bisect_right(self.xs, x) - 1
        return self.ys[i] + self.slopes[i] * (x - self.xs[i])



class CurveTables:
    """Named access to the knot tables in `curves` (a fitted cost model, and the fitter's reports)."""

    curves: dict[str, list[tuple[int, float]]]

    @property
    def linear(self) -> list[tuple[int, float]]:
        return self.curves["linear"]

    @property
    def lm_head(self) -> list[tuple[int, float]]:
        return self.curves["lm_head"]

