"""fit.png: measured against predicted time of every profiled shape, and the fitted curves."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from costs.fit_results import FitReport
from costs.fitted import Fitted
from costs.fitted_form import predict_arrays

KIND_COLORS = {"prefill": "#1f77b4", "decode": "#d62728", "hybrid": "#2ca02c", "padded_prefill": "#9467bd",
                "padded_decode": "#ff7f0e"}



def fit_figure(path: Path, df: pd.DataFrame, pred: np.ndarray, held: np.ndarray, fitted: Fitted,
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
        color = KIND_COLORS.get(kind, f"C{i + 5}")
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
    fig.savefig(path, format="png", dpi=110)  # path: write_files' temporary
    plt.close(fig)

