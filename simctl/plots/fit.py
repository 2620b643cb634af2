"""fit.png: measured against predicted time of every profiled shape, and the fitted curve of one prompt's
prefill."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from simctl.costs.fit_results import FitReport
from simctl.costs.fitted import Fitted
from simctl.costs.fitted_form import predict_arrays
from simctl.plots.log_scale import log_axes

if TYPE_CHECKING:
    from matplotlib.axes import Axes

KIND_COLORS = {"prefill": "#1f77b4", "decode": "#d62728", "hybrid": "#2ca02c", "padded_prefill": "#9467bd",
               "padded_decode": "#ff7f0e"}
PROMPT_COLOR = "#1f77b4"


def fit_figure(path: Path, df: pd.DataFrame, pred: np.ndarray, held: np.ndarray, fitted: Fitted,
               report: FitReport) -> None:
    """Left: every profiled shape, measured against predicted (held-out rows hollow). Right: one prompt
    prefilled from an empty cache, time against tokens, with the fitted curve. `path`: write_files'
    temporary."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    y = df["time_s"].to_numpy(dtype=np.float64) * 1e3  # times in milliseconds from here on
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(14, 6.2), constrained_layout=True)
    _measured_vs_predicted(ax1, y, pred * 1e3, df["kind"].to_numpy(), held, report)
    prompt = ((df["num_segments"] == 1) & (df["decode_rows"] == 0)
              & np.isclose(df["attn_kv_tokens"], df["linear_tokens"])).to_numpy()
    if prompt.any():
        _prefill_curve(ax2, df["linear_tokens"].to_numpy()[prompt], y[prompt], held[prompt], fitted)
    else:
        ax2.text(0.5, 0.5, "no single-prompt prefill rows in the profile", ha="center", va="center",
                 transform=ax2.transAxes)
        ax2.set_axis_off()
    fig.suptitle(_title(report, fitted.tile), fontsize=12)
    fig.savefig(path, format="png", dpi=110)
    plt.close(fig)


def _measured_vs_predicted(ax: Axes, y: np.ndarray, pred: np.ndarray, kinds: np.ndarray, held: np.ndarray,
                           report: FitReport) -> None:
    """Every row, per kind, log-log around y = x and a ±10% band."""
    lo, hi = min(y.min(), pred.min()) / 1.3, max(y.max(), pred.max()) * 1.3
    ax.plot([lo, hi], [lo, hi], color="black", lw=1, label="y = x")
    ax.fill_between([lo, hi], [lo / 1.1, hi / 1.1], [lo * 1.1, hi * 1.1], color="grey", alpha=0.15,
                    label="±10%")
    for i, kind in enumerate(sorted(set(kinds.tolist()))):
        color = KIND_COLORS.get(kind, f"C{i + 5}")
        m = kinds == kind
        st = report.holdout.get(kind)
        label = f"{kind} (held-out MAPE {st.mape:.1%})" if st else kind
        ax.scatter(y[m & ~held], pred[m & ~held], s=14, color=color, alpha=0.55, lw=0, label=label)
        ax.scatter(y[m & held], pred[m & held], s=40, facecolors="none", edgecolors=color, lw=1.3)
    ax.scatter([], [], s=40, facecolors="none", edgecolors="black", label="held out (hollow)")
    log_axes(ax)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel("measured iteration time (ms)")
    ax.set_ylabel("predicted iteration time (ms)")
    ax.set_title("measured vs fitted, every profiled shape")
    ax.grid(True, which="major", alpha=0.3)
    ax.legend(loc="upper left", fontsize=9, markerscale=1.6)


def _prompt_ms(fitted: Fitted, tokens: np.ndarray) -> np.ndarray:
    """The fitted time of one prompt of each length in `tokens`, prefilled from an empty cache (ms)."""
    ones, zeros = np.ones_like(tokens), np.zeros_like(tokens)
    return predict_arrays(fitted.coefficients, fitted.curves, fitted.tile, tokens, ones, tokens * tokens / 2,
                          tokens, ones, zeros, zeros) * 1e3


def _prefill_curve(ax: Axes, T: np.ndarray, y: np.ndarray, held: np.ndarray, fitted: Fitted) -> None:
    """One prompt's rows (T tokens, y ms) and the fitted curve with its linear-layer knots, log-log; a
    linear zoom on the tile steps where the tile is large enough to show them."""
    tile = fitted.tile
    ax.scatter(T[~held], y[~held], s=18, color=PROMPT_COLOR, alpha=0.7, lw=0, label="measured (fit)")
    ax.scatter(T[held], y[held], s=42, facecolors="none", edgecolors=PROMPT_COLOR, lw=1.3,
               label="measured (held out)")
    tmax = int(T.max())
    grid = np.unique(np.concatenate([np.arange(1, min(tmax, 20000) + 1),
                                     np.geomspace(1, tmax, 2000).round()])).astype(np.float64)
    ax.plot(grid, _prompt_ms(fitted, grid), color="black", lw=1.2, label=f"fitted (tile {tile})")
    knots = np.array([n for n, _ in fitted.linear if 1 <= n <= tmax], dtype=np.float64)
    if len(knots):
        ax.plot(knots, _prompt_ms(fitted, knots), "|", color="black", ms=9, mew=1.2,
                label="knots of the linear-layer curve")
    log_axes(ax)
    ax.set_xlabel("prompt tokens T (one prompt, empty cache)")
    ax.set_ylabel("iteration time (ms)")
    ax.set_title(f"prefill time vs tokens; steps every {tile} tokens above {tile}" if tile > 1
                 else "prefill time vs tokens (tile 1: no periodic tile step)")
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(True, which="major", alpha=0.3)
    if tile >= 16 and tmax > 3 * tile:
        _tile_zoom(ax, T, y, fitted)


def _tile_zoom(ax: Axes, T: np.ndarray, y: np.ndarray, fitted: Fitted) -> None:
    """Inset: a linear zoom over a few tiles around the largest boundary with measured points."""
    tile = fitted.tile
    lo_t = tile * max(1, int(np.median(T[T > tile]) // tile) - 1) if (T > tile).any() else tile
    hi_t = lo_t + 3 * tile
    ins = ax.inset_axes((0.07, 0.5, 0.42, 0.4))
    g = np.arange(lo_t - tile // 2, hi_t + 1, dtype=np.float64)
    g = g[g >= 1]
    ins.plot(g, _prompt_ms(fitted, g), color="black", lw=1)
    mz = (T >= g[0]) & (T <= g[-1])
    ins.scatter(T[mz], y[mz], s=14, color=PROMPT_COLOR)
    ins.set_title(f"zoom: T = {int(g[0])}..{int(g[-1])} (ms)", fontsize=8)
    ins.tick_params(labelsize=7)
    ins.grid(True, alpha=0.3)


def _title(report: FitReport, tile: int) -> str:
    """The held-out error overall (the training error when nothing was held out)."""
    ov_h = report.holdout.get("overall")
    ov = ov_h or report.train.get("overall")
    which = "held-out" if ov_h else "training"
    return (f"{report.model} on {report.device}: fitted cost model, {which} MAPE {ov.mape:.2%}, "
            f"P95 {ov.p95:.2%} ({ov.n} rows); tile {tile}" if ov else report.model)
