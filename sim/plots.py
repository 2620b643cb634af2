"""Figures a user looks at: latency against load for a capacity search."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import pandas as pd
from matplotlib.figure import Figure

from sim.capacity import SLO


def capacity_figure(probes: pd.DataFrame, capacities: dict[str, float], slo: SLO) -> Figure:
    """P99 TBT, median TTFT and median scheduling delay against QPS for every probed run, one line per
    policy, with the SLO limits and each policy's capacity marked."""
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5), constrained_layout=True)
    panels = (("tbt_p99", "P99 TBT (s)", slo.tbt_p99_s), ("ttft_p50", "median TTFT (s)", slo.ttft_p50_s),
              ("sched_delay_p50", "median scheduling delay (s)", slo.sched_delay_p50_s))
    for i, (policy, group) in enumerate(probes.sort_values("qps").groupby("policy", sort=False)):
        color = f"C{i}"
        for ax, (col, _, _) in zip(axes, panels):
            ax.plot(group["qps"], group[col], "o-", color=color, ms=4,
                    label=f"{policy}: {capacities[policy]:.2f} QPS")
            if capacities[policy] > 0:
                ax.axvline(capacities[policy], color=color, ls=":", lw=1)
    for ax, (_, label, limit) in zip(axes, panels):
        if limit is not None:
            ax.axhline(limit, color="black", ls="--", lw=1)
            ax.annotate("SLO", (0.01, limit), xycoords=("axes fraction", "data"), va="bottom", fontsize=8)
        ax.set_xlabel("arrival rate (QPS)")
        ax.set_ylabel(label)
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(title="capacity", fontsize=8)
    first = probes.iloc[0]
    fig.suptitle(f"capacity on {first['trace']}: {first['model']} / {first['gpu']} x{first['tp']} "
                 f"(dotted: capacity; dashed: SLO)")
    return fig
