"""Figures a user looks at: latency against load for a capacity search."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from simctl.results.slo import summary_key
from simctl.studies.capacity import Capacity

LABELS = {"ttft": "TTFT", "tbt": "TBT", "tpot": "TPOT", "e2e": "E2E", "sched_delay": "scheduling delay"}


def _panels(results: list[Capacity]) -> list[tuple[str, str, dict[str, float]]]:
    """(summary column, axis label, {SLO name: limit}) per panel: every percentile an SLO limits (P99 TBT
    and P50 TTFT when none does), then the median scheduling delay every SLO limits."""
    keys: dict[str, dict[str, float]] = {}
    for r in results:
        for key, limit in r.slo.percentiles.items():
            keys.setdefault(summary_key(key), {})[r.slo_name] = limit
    if not keys:
        keys = {"tbt_p99": {}, "ttft_p50": {}}
    keys["sched_delay_p50"] = {r.slo_name: r.slo.sched_delay_p50_s for r in results}
    panels = []
    for col, limits in keys.items():
        metric, pct = col.rsplit("_", 1)
        panels.append((col, f"{pct.upper()} {LABELS[metric]} (s)", limits))
    return panels


def capacity_figure(probes: pd.DataFrame, results: list[Capacity]) -> Figure:
    """Every percentile an SLO limits (and the median scheduling delay) against QPS for every probed run, one
    line per policy (the probes of every SLO's search pooled: a rate's run does not depend on the SLO), with
    each SLO's limit dashed and each policy's capacity under each SLO dotted."""
    panels = _panels(results)
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 4.5), constrained_layout=True,
                             squeeze=False)
    axes = axes[0]
    x = results[0].variable  # the rate, or closed loop the concurrency
    runs = probes.sort_values(x).drop_duplicates(["config", "seed", x])
    for i, (name, group) in enumerate(runs.groupby("config", sort=False)):
        caps = [r for r in results if r.name == name]
        label = f"{name}: " + ", ".join(f"{r.slo_name} {r.qps:.3g}" for r in caps)
        for ax, (col, _, _) in zip(axes, panels):
            for j, (_, seed_runs) in enumerate(group.groupby("seed")):
                ax.plot(seed_runs[x], seed_runs[col], "o-", color=f"C{i}", ms=3, lw=1,
                        label=label if j == 0 else None)
            for r in caps:
                if r.qps > 0:
                    ax.axvline(r.qps, color=f"C{i}", ls=":", lw=1)
    for ax, (_, label, limits) in zip(axes, panels):
        names: dict[float, list[str]] = {}  # SLOs sharing a limit share its line
        for name, limit in limits.items():
            names.setdefault(limit, []).append(name)
        for limit, named in names.items():
            ax.axhline(limit, color="black", ls="--", lw=1)
            ax.annotate(f"SLO {', '.join(named)}", (0.01, limit), xycoords=("axes fraction", "data"),
                        va="bottom", fontsize=8)
        ax.set_xlabel("arrival rate (QPS)" if x == "qps" else "concurrency (closed-loop clients)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(title=f"capacity ({'QPS' if x == 'qps' else 'clients'}, median over seeds)", fontsize=8)
    first = probes.iloc[0]
    setups = probes[["model", "gpu", "tp"]].drop_duplicates()
    where = f": {first['model']} / {first['gpu']} x{first['tp']}" if len(setups) == 1 else ""
    definition = "sustainable" if all(r.slo.definition == "sustainable" for r in results) else "paper"
    fig.suptitle(f"capacity ({definition} definition) on {first['trace']}{where} (dotted: capacity; "
                 "dashed: SLO)")
    return fig
