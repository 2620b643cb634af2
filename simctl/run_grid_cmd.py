"""`simctl run` with comma lists (`--token-budget 256,512`, `--policy vllm,sarathi`, `--tp 1,2`, ...): one run
per combination (`simctl.option_grid`), one row each."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from rich.markup import escape
from rich.table import Table

from simctl.common.errors import InputError
from simctl.display import fmt, fmt_rate, out_console

if TYPE_CHECKING:
    from simctl.option_grid import Combination
    from simctl.results.slo import SLO
    from simctl.serving.cluster_config import ClusterConfig

COLUMNS = (  # (summary key, caption)
    ("ttft_p50", "P50 TTFT s"), ("ttft_p99", "P99 TTFT s"), ("tbt_p99", "P99 TBT s"),
    ("tpot_p50", "P50 TPOT s"),
    ("throughput_tokens_per_s", "output tok/s"), ("saturation", "saturation"), ("rejected", "refused"),
)


def check_single_outputs(**given: Any) -> None:
    """The outputs of one run (files, JSON, a timeline) are refused for several: say which option."""
    for name, value in given.items():
        if value:
            raise InputError(f"--{name.replace('_', '-')} writes one run; with comma lists `run` prints one "
                             "row per combination (use `simctl sweep` to keep every run's files)")


def run_grid(combos: list[Combination], cluster: ClusterConfig, slo: SLO | None) -> None:
    from simctl.sim.run import run
    from simctl.studies.goodput import with_attainment
    from simctl.usage_errors import warn_all

    for c in combos:
        c.config.validate()
        cluster.validate(c.config.policy)
    w = combos[0].config.workload
    table = Table(title=escape(f"{w.trace} at {fmt_rate(w.qps)} QPS offered, {w.num_requests} requests"),
                  caption="refused: requests longer than the max model length (out of the percentiles)"
                  + ("; SLO attainment: share of all requests, refused ones included" if slo else ""))
    for col in ("configuration", *(caption for _, caption in COLUMNS), *(("SLO attainment", "SLO met")
                                                                         if slo else ())):
        table.add_column(col, justify="right")
    warnings: list[str] = []
    for c in combos:
        r = run(c.config, cluster)
        s = with_attainment(r.summary, r.result.request_columns, slo)
        warnings += s.get("warnings", [])
        cells = [s.get(k, 0) if k == "rejected" else s.get(k) for k, _ in COLUMNS]
        judged = (fmt(s.get("slo_attainment")), str(s["slo_met"])) if slo else ()
        table.add_row(escape(c.label), *(v if isinstance(v, str) else str(v) if isinstance(v, int)
                                        else fmt(v) for v in cells), *judged)
    out_console().print(table)
    warn_all(dict.fromkeys(warnings))
