"""Figures across runs: capacity under each SLO per scheduler (Sarathi-Serve Figures 9-10), throughput per GPU
against the per-user token rate (a Pareto front), and SLO attainment against the offered rate."""

from __future__ import annotations

import textwrap

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import ScalarFormatter

from simctl.common.errors import InputError
from simctl.plots.inputs import LABELS, setup_text

SETUP = LABELS[1:]  # trace, model, gpu, tp: one panel (or one line family) per setup


def _setups(frame: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    keys = [k for k in SETUP if k in frame.columns]
    return [(setup_text(g, tuple(keys)), g) for _, g in frame.groupby(keys, sort=False, dropna=False)]


def _slo_title(frame: pd.DataFrame) -> str:
    slos = frame["slo"].dropna().unique() if "slo" in frame.columns else []
    return f"SLO: {slos[0]}" if len(slos) == 1 else ("SLOs below" if len(slos) else "SLO: none given")


def _shared_tail(labels: list[str]) -> tuple[list[str], str]:
    """The comma-separated conditions every label ends with (the scheduling-delay rule...), said once."""
    parts = [label.split(", ") for label in labels]
    n = 0
    while all(len(p) > n + 1 for p in parts) and len({tuple(p[len(p) - n - 1:]) for p in parts}) == 1:
        n += 1
    return [", ".join(p[:len(p) - n]) for p in parts], ", ".join(parts[0][len(parts[0]) - n:]) if n else ""


def capacity_figure(caps: pd.DataFrame) -> Figure:
    """One panel per setup, one group of bars per SLO, one bar per policy: the capacity (the median over
    seeds), with the seeds' range. A search without an upper bound is labelled '>='; one that found none,
    'none'."""
    if caps.empty:
        raise InputError("no capacity results in these folders (give simctl capacity or sweep output with "
                         "capacity points)")
    setups = _setups(caps)
    policies = list(dict.fromkeys(caps["policy"]))
    fig, axes = plt.subplots(len(setups), 1,
                             figsize=(max(7.0, 1.2 + 0.9 * len(policies) * caps["slo"].nunique()),
                                                       1.5 + 3.6 * len(setups)), squeeze=False,
                             constrained_layout=True)
    width = 0.8 / len(policies)
    for ax, (name, group) in zip(axes[:, 0], setups):
        slos = list(dict.fromkeys(group["slo"]))
        for j, policy in enumerate(policies):
            for x, slo in enumerate(slos):
                rows = group[(group["policy"] == policy) & (group["slo"] == slo)]
                if rows.empty:
                    continue
                r = rows.iloc[0]
                q, lo, hi = (float(r[c]) for c in ("capacity_qps", "capacity_qps_min", "capacity_qps_max"))
                pos = x - 0.4 + width * (j + 0.5)
                ax.bar(pos, q, width * 0.92, color=f"C{j}", yerr=[[q - lo], [hi - q]] if hi > lo else None,
                       capsize=3, label=policy if x == 0 else None)
                open_ended = str(r["problem"] or "").startswith("no upper bound")
                text = "none" if q == 0 else (">=" if open_ended else "") + f"{q:.3g}"
                ax.annotate(text, (pos, hi), ha="center", va="bottom", fontsize=8, xytext=(0, 2),
                            textcoords="offset points")
        shown, tail = _shared_tail(slos)
        ax.set_xticks(range(len(slos)), [textwrap.fill(s, 34) for s in shown], fontsize=8)
        ax.set_xlabel(f"SLO (each also: {tail})" if tail else "SLO", fontsize=9)
        ax.set_ylabel("capacity (requests/s)")
        ax.set_title(name, fontsize=10)
        ax.grid(True, axis="y", alpha=0.3)
        ax.margins(y=0.15)
        ax.legend(title="scheduler", fontsize=8, ncols=min(len(policies), 4))
    fig.suptitle(textwrap.fill("capacity per scheduler: the highest sustainable rate meeting the SLO"
                               + ("" if caps["slo"].nunique() > 1 else f"; {_slo_title(caps)}"),
                               int(fig.get_figwidth() * 9)))
    return fig


def _per_gpu(points: pd.DataFrame) -> np.ndarray:
    gpus = points["tp"].fillna(1).to_numpy(float)
    if "replicas" in points.columns:
        gpus = gpus * points["replicas"].fillna(1).to_numpy(float)
    if "gpus" in points.columns:  # a cluster's summary counts its GPUs (a disaggregated one's pools included)
        gpus = np.where(points["gpus"].notna(), points["gpus"].to_numpy(float), gpus)
    return points["throughput_tokens_per_s"].to_numpy(float) / gpus


def _need(points: pd.DataFrame, columns: tuple[str, ...], figure: str) -> None:
    missing = [c for c in columns if c not in points.columns]
    if points.empty or missing:
        raise InputError(f"no runs to draw the {figure} figure from"
                         + (f" (missing {', '.join(missing)})" if missing and not points.empty else ""))


def _series(points: pd.DataFrame, split: tuple[str, ...] = ("policy", *SETUP, "slo")
            ) -> list[tuple[str, pd.DataFrame]]:
    """Lines: one per value of the `split` columns that vary (an SLO named by its short name), by rate."""
    keys = [k for k in split if k in points.columns and points[k].nunique(dropna=False) > 1] or ["policy"]
    out = []
    for key, g in points.groupby(keys, sort=False, dropna=False):
        names = [str(v).split(":")[0] if k == "slo" else str(v)
                 for k, v in zip(keys, key if isinstance(key, tuple) else (key,))]
        out.append((" / ".join(names), g.sort_values("qps")))
    return out


def _slo_footnote(fig: Figure, points: pd.DataFrame) -> None:
    """Several SLOs: each line names its SLO by its short name, defined here."""
    slos = points["slo"].dropna().unique() if "slo" in points.columns else []
    if len(slos) > 1:
        fig.text(0.01, 0.005, "\n".join(textwrap.fill(s, 150) for s in slos), fontsize=7, va="bottom")
        fig.get_layout_engine().set(rect=(0, 0.04 * len(slos), 1, 1 - 0.04 * len(slos)))


MARKERS = "osD^vPX<>ph"  # with the 10 colours, 110 lines told apart


def _styles(policies: list[str]) -> list[dict[str, str]]:
    """Each line's colour and marker: with several policies and more lines than policies (settings or P/D
    splits compared), a colour per policy and a marker per line of it, so that a family reads as one;
    otherwise a colour per line (and a new marker after every 10)."""
    families = list(dict.fromkeys(policies))
    if not 1 < len(families) < len(policies) or len(families) > 10:
        return [{"color": f"C{i % 10}", "marker": MARKERS[i // 10 % len(MARKERS)]}
                for i in range(len(policies))]
    seen: dict[str, int] = {}
    styles = []
    for p in policies:
        seen[p] = seen.get(p, -1) + 1
        styles.append({"color": f"C{families.index(p)}", "marker": MARKERS[seen[p] % len(MARKERS)]})
    return styles


def _named(points: pd.DataFrame) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """The columns that name a line: a configuration's label (capacity's or plan's settings compared; a
    policy where a folder has none, such as a sweep's or a run's), and the setup where it varies within one
    label (folders of several traces)."""
    if "config" not in points.columns:
        return points, ("policy", *SETUP)
    points = points.assign(config=points["config"].fillna(points["policy"]))
    varies = [k for k in SETUP if k in points.columns
              and (points.groupby("config", dropna=False)[k].nunique(dropna=False) > 1).any()]
    return points, ("config", *varies)


def pareto_figure(points: pd.DataFrame, chosen: list[tuple[str, float, float]] | None = None) -> Figure:
    """Output tokens/s per GPU against each user's token rate (1 / median TPOT), one line per policy over the
    rates run (runs, capacity probes, sweep points); hollow markers: unsustainable runs. With `chosen`
    ((name, tokens/s per user, per GPU) of each choice of a plan), also the Pareto front of the runs that met
    the SLO (`slo_met`) and the choices, starred."""
    _need(points, ("tpot_p50", "throughput_tokens_per_s", "qps", "policy"), "pareto")
    points = points[points["tpot_p50"].notna() & (points["tpot_p50"] > 0)]
    # a run judged against several SLOs (a sweep's rows) is one point here
    # a configuration of settings compared (capacity's or plan's lists) is one line, named by what varies
    points, split = _named(points)
    points = points.drop_duplicates([c for c in (*split, "policy", *SETUP, "qps", "seed")
                                     if c in points.columns])
    fig, ax = plt.subplots(figsize=(12 if chosen is not None else 9, 6), constrained_layout=True)
    series = _series(points, split)
    for (label, g), style in zip(series, _styles([str(g["policy"].iloc[0]) for _, g in series])):
        x, y = 1.0 / g["tpot_p50"].to_numpy(float), _per_gpu(g)
        ok = g["sustainable"].to_numpy(bool) if "sustainable" in g.columns else np.ones(len(g), bool)
        along = np.argsort(x, kind="stable")  # a line from the slowest per user to the fastest
        x, y, ok = x[along], y[along], ok[along]
        style = {**style, "ms": 5}
        ax.plot(x, y, "-", color=style["color"], lw=1, alpha=0.6)
        ax.plot(x[ok], y[ok], ls="none", label=label, **style)
        ax.plot(x[~ok], y[~ok], ls="none", mfc="none", **style)
    handles, labels = ax.get_legend_handles_labels()
    handles.append(Line2D([], [], marker="o", mfc="none", color="grey", ls="none"))
    labels.append("unsustainable run")
    if chosen is not None:
        _front_and_choices(ax, points, chosen, handles, labels)
    ax.set_xlabel("per-user token rate (tokens/s per request = 1 / median TPOT)")
    ax.set_ylabel("throughput per GPU (output tokens/s)")
    ax.grid(True, alpha=0.3)
    ax.legend(handles, labels, fontsize=8, **({"loc": "upper left", "bbox_to_anchor": (1.01, 1)}
                                              if chosen is not None else {}))
    ax.set_title(f"throughput vs interactivity: {setup_text(points) or 'several setups'}", fontsize=10)
    return fig


def _front_and_choices(ax: plt.Axes, points: pd.DataFrame, chosen: list[tuple[str, float, float]],
                       handles: list, labels: list[str]) -> None:
    """The upper-right envelope of the runs meeting the SLO (no other such run is both faster per user and
    more productive per GPU), and each choice at its capacity, numbered as in the plan's table."""
    met = points[points["slo_met"].fillna(False).astype(bool)] if "slo_met" in points.columns else points
    x, y = 1.0 / met["tpot_p50"].to_numpy(float), _per_gpu(met)
    order = np.argsort(-x)
    front = [(x[k], y[k]) for n, k in enumerate(order) if y[k] > max(y[order[:n]], default=-np.inf)]
    if front:
        ax.plot(*zip(*front), "k--", lw=1.5, drawstyle="steps-post")
        handles.append(Line2D([], [], color="k", ls="--"))
        labels.append("Pareto front of the runs meeting the SLO")
    # choices sit close together (near the front's knee), and above the front to the right no run meets the
    # SLO: their labels stand in a column there, each with a leader line to its star, in the order of their
    # heights (lines that do not cross)
    for _, cx, cy in chosen:
        ax.plot(cx, cy, "*", color="k", ms=14, mfc="gold", zorder=5)
    for row, k in enumerate(sorted(range(len(chosen)), key=lambda k: -chosen[k][2])):
        name, cx, cy = chosen[k]
        ax.annotate(f"#{k + 1} {name}", (cx, cy), xytext=(0.6, 0.95 - 0.06 * row), textcoords="axes fraction",
                    fontsize=8, weight="bold", va="center", zorder=6,
                    bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "0.6", "alpha": 0.9},
                    arrowprops={"arrowstyle": "-", "color": "0.3", "lw": 0.8, "shrinkB": 6})
    handles.append(Line2D([], [], marker="*", color="k", mfc="gold", ms=12, ls="none"))
    labels.append("a choice at its capacity (#: the table's row)")


def _rate_axis(ax: plt.Axes) -> None:
    ax.set_xscale("log")
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(lambda v, _: f"{v:g}" if f"{v:.1g}"[0] in "235" else "")
    ax.set_xlabel("offered rate (requests/s, log scale)")
    ax.grid(True, which="both", alpha=0.3)


def attainment_figure(points: pd.DataFrame) -> Figure:
    """The share of requests meeting the per-request SLO (`slo_attainment`) against the offered rate. Probes
    of a percentile-only SLO have no per-request share: each line then shows which rates met the SLO."""
    _need(points, ("qps", "policy"), "attainment")
    has_share = "slo_attainment" in points.columns and points["slo_attainment"].notna().any()
    column = "slo_attainment" if has_share else "slo_met"
    if column not in points.columns or points[column].isna().all():
        raise InputError("these runs were not judged against an SLO (no slo_attainment or slo_met): give "
                         "capacity or sweep output")
    points = points[points[column].notna()]
    series = _series(points)
    fig, ax = plt.subplots(figsize=(9, 5.5 if has_share else 1.8 + 0.5 * len(series)),
                           constrained_layout=True)
    for i, (label, g) in enumerate(series):
        if has_share:
            ax.plot(g["qps"], g[column].astype(float), "o-", color=f"C{i}", ms=4, label=label)
            continue
        met = g[column].astype(bool).to_numpy()
        ax.plot(g["qps"][met], np.full(met.sum(), i), "o", color="tab:green", ms=7)
        ax.plot(g["qps"][~met], np.full((~met).sum(), i), "x", color="tab:red", ms=8, mew=2)
    if has_share:
        if "attainment" in points.columns and points["attainment"].nunique() == 1:
            target = float(points["attainment"].iloc[0])
            ax.axhline(target, color="black", ls="--", lw=1, label=f"required {target:.0%}")
        ax.set_ylabel("share of requests within the SLO")
        ax.set_ylim(-0.05, 1.05)
        ax.legend(fontsize=8)
    else:
        ax.set_yticks(range(len(series)), [label for label, _ in series])
        ax.set_ylim(len(series) - 0.5, -0.5)
        ax.legend([Line2D([], [], marker="o", color="tab:green", ls="none"),
                   Line2D([], [], marker="x", color="tab:red", ls="none", mew=2)],
                  ["SLO met", "SLO missed"], fontsize=8, loc="lower right")
    _rate_axis(ax)
    what = "SLO attainment" if has_share else "SLO met or missed (a percentile SLO has no per-request share)"
    fig.suptitle(textwrap.fill(f"{what} vs rate: {setup_text(points) or 'several setups'}; "
                               f"{_slo_title(points)}", 90), fontsize=10)
    _slo_footnote(fig, points)
    return fig
