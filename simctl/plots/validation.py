"""A validation's figure: measured against predicted CDFs of TTFT and TBT."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from simctl.plots.log_scale import log_axes
from simctl.results.validation_report import ValidationReport, fmt_err, load_unit
from simctl.serving.records import GapHistogram


def _hist_cdf(gaps: GapHistogram) -> tuple[np.ndarray, np.ndarray]:
    """(values, cumulative fraction) of the gaps (bin centres)."""
    idx = np.nonzero(gaps.counts)[0]
    if len(idx) == 0:
        return np.empty(0), np.empty(0)
    x = 10 ** (gaps.LOW_EXP + (idx + 0.5) / gaps.PER_DECADE)
    y = np.cumsum(gaps.counts[idx]) / gaps.counts[idx].sum()
    return x, y


def _ecdf(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray(v, dtype=float))
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def cdf_figure(report: ValidationReport, path: Path) -> None:
    """Measured (solid) and predicted (dashed) CDFs of TTFT and TBT: one row per policy, one column per
    metric and load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(dict.fromkeys(p.policy for p in report.pairs))
    loads = list(dict.fromkeys(p.load for p in report.pairs))
    cols = [(m, load) for m in ("TTFT", "TBT") for load in loads]
    nr, nc = max(len(policies), 1), max(len(cols), 1)
    fig, axes = plt.subplots(nr, nc, figsize=(3.4 * nc + 0.6, 2.5 * nr + 0.9), squeeze=False,
                             constrained_layout=True)
    pairs = {(p.policy, p.load): p for p in report.pairs}
    rows = {(r["policy"], r["load"]): r for r in report.rows}
    for i, policy in enumerate(policies):
        for j, (metric, load) in enumerate(cols):
            ax = axes[i][j]
            pair = pairs.get((policy, load))
            if pair is None:
                ax.set_visible(False)
                continue
            if metric == "TTFT":
                (xr, yr), (xs, ys) = _ecdf(pair.real_ttft), _ecdf(pair.sim_ttft)
                key = "ttft_p50"
            else:
                (xr, yr), (xs, ys) = _hist_cdf(pair.real_gaps), _hist_cdf(pair.sim_gaps)
                key = "tbt_p50"
            ax.step(xr * 1e3, yr, where="post", color="C0", lw=1.6, label="measured")
            ax.step(xs * 1e3, ys, where="post", color="C3", lw=1.4, ls="--", label="predicted")
            log_axes(ax, "x")
            ax.set_ylim(0, 1.02)
            ax.grid(True, which="both", alpha=0.3)
            ax.tick_params(labelsize=8)
            r = rows[(policy, load)]
            note = "" if metric == "TTFT" or pair.replay_complete else " (replay partial)"
            var, unit = load_unit(r)
            ax.set_title(f"{policy}: {metric} @ load {load:g} ({r[var]:.3g} {unit})\nP50 error "
                         f"{fmt_err(r[key + '_err_pct'])}{note}", fontsize=9)
            if i == nr - 1:
                ax.set_xlabel(f"{metric} (ms)", fontsize=9)
            if j == 0:
                ax.set_ylabel("fraction", fontsize=9)
    axes[0][0].legend(fontsize=8, loc="lower right")
    c = report.config
    fig.suptitle(f"measured (solid) vs predicted (dashed) CDFs\n{c['model']} on CPU, {c['trace']} x "
                 f"{c['scale']:g}, {c['num_requests']} requests per run", fontsize=11)
    fig.savefig(path, dpi=100, format="png")  # path: write_files' temporary
    plt.close(fig)

