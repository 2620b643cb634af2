"""`simctl capacity --goodput` (or capacity with cluster options): the highest rate each policy's deployment
meets the --slo at, and that rate per GPU (DistServe's goodput), from `simctl.studies.goodput`."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from simctl.common.errors import InputError

if TYPE_CHECKING:
    from simctl.results.slo import SLO
    from simctl.serving.cluster_config import ClusterConfig
    from simctl.sim.run import RunConfig

GOODPUT_FILES = ("goodput.json",)


def goodput_command(configs: list[RunConfig], cluster: ClusterConfig, slo: SLO, slo_given: bool,
                    start_qps: float, seeds: int, out: Path | None) -> None:
    from rich.markup import escape
    from rich.table import Table

    from simctl.display import fmt, out_console
    from simctl.results.output import check_out_dir, json_text, write_files
    from simctl.studies.goodput import find_goodput
    from simctl.usage_errors import note_replaced, warn_all

    if not slo_given:
        raise InputError("--goodput (and capacity with cluster options) needs --slo, e.g. --slo "
                         "ttft=2,tpot=0.1 (DistServe's per-request limits, met by --attainment of the "
                         "requests)")
    if seeds != 1:
        raise InputError("--seeds is not available with --goodput")
    for c in configs:
        c.validate()
        cluster.validate(c.policy)
    if out is not None:
        check_out_dir(out, GOODPUT_FILES)
    console = out_console()
    console.print(escape(f"SLO: {slo.describe()}"))
    results = [find_goodput(c.with_workload(qps=start_qps), cluster, slo, start_qps) for c in configs]
    table = Table(title=escape(f"goodput on {configs[0].workload.trace}: {configs[0].model}"))
    for col in ("policy", "deployment", "GPUs", "rate QPS", "goodput QPS/GPU", "attainment", "probes"):
        table.add_column(col, justify="right")
    for g in results:
        r = g.row()
        table.add_row(r["policy"], r["deployment"], str(r["gpus"]), fmt(r["goodput_qps"]),
                      fmt(r["goodput_per_gpu"]), fmt(r["slo_attainment"]), str(r["probes"]))
    console.print(table)
    warn_all(f"{g.config.policy}: {g.search.problem}" for g in results if g.search.problem)
    if out is not None:
        text = json_text({"slo": slo.to_dict(), "slo_described": slo.describe(), "cluster": asdict(cluster),
                          "goodput": [g.row() for g in results],
                          "probes": {g.config.policy: g.search.probes for g in results}})
        note_replaced(out, GOODPUT_FILES)
        write_files(Path(out), {"goodput.json": lambda p: p.write_text(text, encoding="utf-8")},
                    "goodput.json")
        console.print(escape(f"wrote {out}/goodput.json"))

