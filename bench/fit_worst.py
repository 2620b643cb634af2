"""Where `simctl fit`'s held-out iteration error is worst on Vidur's operator profiles, and why (imported by
bench/roofline_vs_measured.py, which writes the results).

Per profile (GPU, model, TP degree) the fit's own split (20% of the interior token counts held out, seed 0)
and its `linear` curve (`simctl.profiler.fit_operators.LayerCurve`), as `simctl fit` builds them; the held-out
iteration's P95 absolute error:
- with the collective as measured (the fit before), or averaged over neighbouring message sizes before the
  curve is built (a rolling mean of 5 sizes: the fit now; a rolling median: checked, not adopted), the
  held-out measurement keeping the collective as measured;
- without the all-reduces (curve and measurement alike): what the operator curves alone miss;
- the all-reduce's own miss at the held-out counts' message sizes, interpolated in the training counts' (P95
  below and above 1 MiB), and its share of the measured iteration.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.ndimage import median_filter, uniform_filter1d

from simctl.profiler.fit_operators import (
    COLLECTIVE_WINDOW,
    DTYPE_BYTES,
    LayerCurve,
    held_counts,
    iteration_seconds,
    profile_subset,
)
from simctl.profiler.operator_profiles import ALL_REDUCES_PER_LAYER, load_operator_profile

HOLDOUT, SEED = 0.2, 0  # the fit's defaults
MIB = 1 << 20
# the collective as the fit sums it: as measured (before), its rolling mean (the fit now:
# `simctl.profiler.fit_operators.smoothed_collective`), its rolling median (checked, not adopted)
SMOOTHERS = {"as measured": lambda t: t,
             "rolling mean": lambda t: uniform_filter1d(t, COLLECTIVE_WINDOW, mode="nearest"),
             "rolling median": lambda t: median_filter(t, size=COLLECTIVE_WINDOW, mode="nearest")}


def _p95(e: np.ndarray) -> float:
    return float(np.percentile(np.abs(e), 95)) if len(e) else float("nan")


def profile_row(root: Path, spec, gpu: str, tp: int) -> dict[str, object]:
    """The held-out errors above for one profile."""
    p = load_operator_profile(root, spec, gpu, tp)
    held = held_counts(len(p.tokens), HOLDOUT, SEED)
    train = profile_subset(p, ~held)
    x, meas = p.tokens[held], iteration_seconds(p, spec)[held]
    row: dict[str, object] = {"gpu": gpu, "model": Path(p.model_dir).name, "tp": tp}
    for name, smooth in SMOOTHERS.items():
        tr = train if p.allreduce is None else dataclasses.replace(
            train, allreduce=(p.allreduce[0], smooth(p.allreduce[1])))
        e = LayerCurve.fit(p, tr, spec).seconds(x) / meas - 1
        row[name] = _p95(e)
        row[f"{name} MAPE"] = float(np.abs(e).mean())
    if p.allreduce is None:
        return row
    bare, bare_train = (dataclasses.replace(q, allreduce=None) for q in (p, train))
    row["without all-reduces"] = _p95(LayerCurve.fit(bare, bare_train, spec).seconds(x)
                                      / iteration_seconds(bare, spec)[held] - 1)
    sizes, secs = p.allreduce
    xs, ts = (n * spec.hidden_size * DTYPE_BYTES for n in (x, train.tokens))
    ar = np.interp(xs, sizes, secs)
    miss = np.interp(xs, ts, np.interp(ts, sizes, secs)) / ar - 1
    row["all-reduce share"] = float((ALL_REDUCES_PER_LAYER * spec.num_layers * ar / meas).mean())
    row["all-reduce < 1 MiB"] = _p95(miss[xs < MIB])
    row["all-reduce >= 1 MiB"] = _p95(miss[xs >= MIB])
    return row


def _table(df: pd.DataFrame, pct: list[str]) -> list[str]:
    cols = list(df.columns)
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in df.itertuples(index=False):
        cells = (f"{v:.1%}" if c in pct and isinstance(v, float) else str(v) for c, v in zip(cols, r))
        out.append("| " + " | ".join(cells) + " |")
    return out


def worst_fits_section(root: Path, ms: list, layers: dict[str, int]) -> list[str]:
    rows = [profile_row(root, dataclasses.replace(m.spec, num_layers=layers[m.model]), m.gpu, m.tp)
            for m in ms]
    df = pd.DataFrame(rows)
    ar_cols = ["without all-reduces", "all-reduce share", "all-reduce < 1 MiB", "all-reduce >= 1 MiB"]
    worst = (df.sort_values("as measured", ascending=False).groupby("gpu").head(3)
             .sort_values(["gpu", "as measured"], ascending=[True, False]))
    names = {"as measured": "iteration, before", "rolling mean": "iteration, now"}
    worst = worst[["gpu", "model", "tp", *names, *ar_cols]].rename(columns=names)
    g = df.groupby("gpu")
    robust = pd.DataFrame({f"{k}: {stat}": fn(g[col]) for k in SMOOTHERS
                           for stat, col, fn in (("worst P95", k, lambda s: s.max()),
                                                 ("median P95", k, lambda s: s.median()),
                                                 ("MAPE", f"{k} MAPE", lambda s: s.mean()))}).reset_index()
    return ["### The worst fits, and why", "",
            ("Held-out iteration P95 (absolute) of the three worst fits per GPU before (the collective "
             "summed as measured), and now (its rolling mean over 5 message sizes); the same without the "
             "all-reduces (curve and measurement); the all-reduces' mean share of the measured iteration; "
             "and the all-reduce's own P95 miss at the held-out counts' message sizes when interpolated in "
             "the training counts' (`-` where tp = 1 or no such size):"), "",
            *_table(worst.fillna("-"), [*names.values(), *ar_cols]), "",
            ("The collective as the fit sums it, per GPU: the worst and median fit's held-out P95 and the "
             "mean MAPE (the held-out measurement keeps the collective as measured):"), "",
            *_table(robust, [c for c in robust.columns if c != "gpu"]), ""]
