"""Figures of single runs: latency CDFs, TBT over time (generation stalls, Sarathi-Serve Figure 1a) and the
iteration timeline of which requests ran prefill or decode (Figure 4)."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simctl.common.errors import InputError
from simctl.plots.decode_gaps import decode_gaps
from simctl.plots.inputs import RunOutput

# TBT over time: beyond this many gaps, each time bin shows its largest (stalls stay visible)
MAX_POINTS = 4000
PREFILL_COLOR, DECODE_COLOR = "tab:orange", "tab:blue"


def run_label(run: RunOutput) -> str:
    s = run.summary
    qps = s.get("offered_qps") or s.get("qps")
    return f"{s['policy']} @ {qps:.3g} QPS" if qps else str(s["policy"])


def runs_title(what: str, runs: list[RunOutput], slo: str | None) -> str:
    s = runs[0].summary
    shared = [k for k in ("model", "gpu", "tp", "trace") if all(r.summary.get(k) == s.get(k) for r in runs)]
    where = ", ".join(x for x in (
        s["model"] if "model" in shared else "",
        f"on {s['gpu']} x{s['tp']}" if {"gpu", "tp"} <= set(shared) else "",
        f"trace {s['trace']}" if "trace" in shared else "") if x)
    return f"{what}: {where}; SLO: {slo or 'none given'}"


def _cdf(ax: plt.Axes, values: np.ndarray, weights: np.ndarray | None, **kw: object) -> None:
    order = np.argsort(values, kind="stable")
    w = np.ones(len(values)) if weights is None else weights[order].astype(float)
    ax.step(values[order], np.cumsum(w) / w.sum(), where="post", **kw)


def cdf_figure(runs: list[RunOutput], slo: str | None = None, tbt_limit: float | None = None) -> Figure:
    """TTFT and E2E per request, TBT per decode token (from the iteration rows), one line per run."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.6), constrained_layout=True)
    for i, run in enumerate(runs):
        req = run.requests[run.requests["completion_s"] >= 0]
        gaps = decode_gaps(run.iterations)
        kw = {"color": f"C{i}", "label": run_label(run)}
        _cdf(axes[0], (req["first_token_s"] - req["arrival_s"]).to_numpy(), None, **kw)
        if len(gaps.gap_s):
            _cdf(axes[1], gaps.gap_s, gaps.weight, **kw)
        _cdf(axes[2], (req["completion_s"] - req["arrival_s"]).to_numpy(), None, **kw)
    for ax, name, unit in zip(axes, ("TTFT", "TBT", "E2E latency"),
                              ("requests", "decode tokens", "requests")):
        ax.set_xscale("log")
        ax.set_xlabel(f"{name} (s, log scale)")
        ax.set_ylabel(f"share of {unit} (CDF)")
        ax.set_ylim(0, 1.02)
        ax.grid(True, which="both", alpha=0.3)
    for q in (0.5, 0.99):
        axes[1].axhline(q, color="grey", lw=0.7, ls=":")
    if tbt_limit is not None:
        axes[1].axvline(tbt_limit, color="black", ls="--", lw=1, label=f"SLO {tbt_limit:g} s")
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle(runs_title("latency CDFs", runs, slo))
    return fig


def _window(t: np.ndarray, window: tuple[float, float] | None) -> np.ndarray:
    return np.ones(len(t), bool) if window is None else (t >= window[0]) & (t <= window[1])


def tbt_figure(runs: list[RunOutput], window: tuple[float, float] | None = None, slo: str | None = None,
               tbt_limit: float | None = None) -> Figure:
    """Each decode token's gap against the time it was sampled, one panel per run: a prefill that stalls the
    running decodes shows as a spike. Dashed: the run's P99 TBT."""
    kept = []
    for run in runs:
        gaps = decode_gaps(run.iterations)
        keep = _window(gaps.time_s, window)
        if window is not None and not keep.any():  # an empty panel would look like a run without stalls
            span = (f"its tokens were sampled from {gaps.time_s.min():.4g} to {gaps.time_s.max():.4g} s"
                    if len(gaps.time_s) else "it sampled no decode token")
            raise InputError(f"{run.path}: no token in --window {window[0]:g}:{window[1]:g} (simulated "
                             f"seconds); {span}")
        kept.append((gaps.time_s[keep], gaps.gap_s[keep]))
    fig, axes = plt.subplots(len(runs), 1, figsize=(12, 2.6 + 2.2 * len(runs)), sharey=True, squeeze=False,
                             constrained_layout=True)
    binned = False
    for i, (ax, run, (t, g)) in enumerate(zip(axes[:, 0], runs, kept)):
        if len(t) > MAX_POINTS:  # the largest gap of each time bin
            binned = True
            bins = np.linspace(t.min(), t.max(), MAX_POINTS + 1)
            idx = np.clip(np.digitize(t, bins) - 1, 0, MAX_POINTS - 1)
            top = np.full(MAX_POINTS, np.nan)
            np.fmax.at(top, idx, g)
            t, g = (bins[:-1] + bins[1:])[~np.isnan(top)] / 2, top[~np.isnan(top)]
        ax.plot(t, g, ".", ms=2.5, color=f"C{i}", label=run_label(run))
        p99 = run.summary.get("tbt_p99")
        if p99:
            ax.axhline(p99, color=f"C{i}", ls="--", lw=1, label=f"P99 TBT {p99 * 1e3:.0f} ms")
        if tbt_limit is not None:
            ax.axhline(tbt_limit, color="black", ls=":", lw=1, label=f"SLO {tbt_limit * 1e3:.0f} ms")
        ax.set_yscale("log")
        ax.set_ylabel("time between tokens (s)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper right")
    axes[-1, 0].set_xlabel("simulated time (s)" + ("; largest gap per time bin" if binned else ""))
    fig.suptitle(runs_title("TBT over time (spikes: decodes stalled by prefills)", runs, slo))
    return fig


def timeline_figure(run: RunOutput, window: tuple[float, float] | None = None,
                    max_requests: int = 40) -> Figure:
    """Which requests each iteration ran, as prefill (a chunk or whole prompt) or decode, over time: one row
    per request, from the iterations the run recorded (`simctl run --timeline N`)."""
    tl = run.timeline
    if tl is None or tl.empty:
        raise InputError(f"{run.path}: no timeline.parquet; record one with `simctl run --timeline N --out "
                         f"{run.path}` (the first N iterations' requests)")
    tl = tl[_window(tl["start_s"].to_numpy(), window)]
    first = tl.groupby("request_id", sort=False)["start_s"].min().sort_values()
    shown = first.index[:max_requests]
    tl = tl[tl["request_id"].isin(shown)]
    if tl.empty:
        raise InputError(f"{run.path}: the timeline has no iteration in the window {window}")
    row = {rid: i for i, rid in enumerate(shown)}
    fig, ax = plt.subplots(figsize=(13, 1.5 + 0.22 * len(shown)), constrained_layout=True)
    for prefill, color in ((True, PREFILL_COLOR), (False, DECODE_COLOR)):
        part = tl[tl["prefill"] == prefill]
        for rid, grp in part.groupby("request_id"):
            spans = list(zip(grp["start_s"], grp["end_s"] - grp["start_s"]))
            ax.broken_barh(spans, (row[rid] - 0.4, 0.8), facecolors=color, edgecolor="white", linewidth=0.3)
    ax.set_yticks(range(len(shown)), [str(r) for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_ylabel("request id (by first iteration)")
    ax.set_xlabel("simulated time (s); each bar is one iteration")
    ax.grid(True, axis="x", alpha=0.3)
    ax.legend(handles=[Patch(color=PREFILL_COLOR, label="prefill (whole prompt or chunk)"),
                       Patch(color=DECODE_COLOR, label="decode (one token)")],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8)
    where = runs_title("", [run], None).removeprefix(": ").removesuffix("; SLO: none given")
    fig.suptitle(f"iteration timeline of {run_label(run)}: {where} ({tl['iteration'].nunique()} iterations, "
                 f"{len(shown)} requests)")
    return fig
