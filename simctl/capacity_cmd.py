"""`simctl capacity`: the highest rate each policy sustains within SLOs given with --slo (results/slo.py's
grammar), or by default under Sarathi-Serve's strict and relaxed SLOs for the deployment (Table 3's rule)."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simctl.common.errors import InputError
from simctl.config_options import Without
from simctl.configs import Deployment, Execution, Workload
from simctl.display import fmt, fmt_rate, out_console, progress_bar
from simctl.goodput_cmd import goodput_command
from simctl.options import Attainment
from simctl.policy_options import PolicyLists
from simctl.serving.cluster_config import ClusterConfig
from simctl.usage_errors import note_replaced, warn_all

if TYPE_CHECKING:
    from rich.table import Table

    from simctl.results.slo import SLO
    from simctl.sim.run import RunConfig
    from simctl.studies.capacity import Capacity, CapacityConfig

SLO_HELP = ("SLO limits, key=seconds (or with a unit: p99_tbt=100ms), comma-separated or repeated: "
            "p50/p90/p99 of ttft, tbt, tpot or e2e (e.g. p99_tbt=0.1,p50_ttft=2: that percentile of the run "
            "within the limit), or plain ttft, tbt (a request's largest gap), tpot, e2e: per-request limits "
            "that a share --attainment of the requests must meet (DistServe's goodput).")
DEFAULT_PROBE_REQUESTS = 1000
TABLE3_HELP = (" Default: two searches, Sarathi-Serve's strict and relaxed P99 TBT SLOs (Table 3: 5x and 25x "
               "one decode iteration of 32 requests with 4k-token contexts on this model/GPU/TP), printed.")


def capacity(
    policies: PolicyLists = PolicyLists(policy="vllm,sarathi"),
    workload: Annotated[Workload, Without("qps")] = Workload(trace="sharegpt", num_requests=None),
    deployment: Deployment = Deployment(),
    execution: Execution = Execution(),
    capacity_definition: Annotated[str, typer.Option(help=(
        "sustainable: a rate whose run is backlogged (a queue that grows, or stands, though the median "
        "scheduling delay is still within its limit: results/saturation.py) is not the capacity; paper: "
        "Sarathi-Serve's definition only (the SLO, the delay limit and a sustainable run)."),
        metavar="sustainable|paper")] = "sustainable",
    slo: Annotated[list[str] | None, typer.Option(help=SLO_HELP + TABLE3_HELP, metavar="KEY=S[,KEY=S]")
                   ] = None,
    attainment: Attainment = None,
    max_sched_delay_p50: Annotated[float,
                                   typer.Option(help="Median scheduling-delay limit, s (Sarathi-Serve's "
                                                       "capacity rule); it and a sustainable run always "
                                                       "apply.")] = 2.0,
    seeds: Annotated[int,
                     typer.Option(help="Searches per policy and SLO, on seeds --seed, --seed + 1, ...: the "
                                       "capacity is their median (of an even count, the lower middle one: "
                                       "a rate a search found), with its spread.")] = 1,
    start_qps: Annotated[float, typer.Option(help="First rate probed; doubled or halved to bracket.")] = 1.0,
    workers: Annotated[int | None, typer.Option(help="Processes searching in parallel, one search each "
                                                "[default: one per core].")] = None,
    out: Annotated[Path | None,
                   typer.Option(help="Folder for capacity.json, probes.parquet and capacity.png.")
                   ] = None,
    cluster: ClusterConfig = ClusterConfig(),
    goodput: Annotated[bool, typer.Option(help=(
        "Goodput (DistServe): the highest rate meeting --slo on the deployment the cluster options describe, "
        "per GPU it uses; writes goodput.json to --out."))] = False,
) -> None:
    """Find the highest request rate each policy sustains within the SLOs (bisection over QPS); with
    --concurrency N, closed-loop clients all ready at once, the highest concurrency (from N) and the
    throughput it reached.

    Example: simctl capacity --policy orca,vllm,sarathi --trace arxiv --slo p99_tbt=0.5 --seeds 3 --out
    out/cap
    """
    from simctl.option_grid import base_config, grid
    from simctl.results.slo import parse_slo
    from simctl.studies.capacity import CapacityConfig

    if workload.num_requests is None:
        workload = replace(workload, num_requests=probe_requests(workload.trace))
    closed = workload.concurrency is not None  # the search is over the concurrency, every request ready
    base = base_config(replace(workload, qps=None if closed else start_qps), deployment, execution)
    combos = grid(base, policies.policy, deployment, policies.settings())
    configs, labels = [c.config for c in combos], [c.label for c in combos]
    given = parse_slo(slo or [], attainment, max_sched_delay_p50)  # also checks --attainment and the delay
    given = replace(given, definition=capacity_definition)
    if goodput or cluster.is_cluster:  # a deployment's rate per GPU (simctl.goodput_cmd)
        if closed:
            raise InputError("--concurrency: a closed loop's capacity is searched on one replica; a "
                             "cluster's (--goodput, or the cluster options) searches rates only")
        return goodput_command(configs, cluster, given, bool(slo), start_qps, seeds, out)
    CapacityConfig(configs, {"given": given}, start_qps, workers, seeds, labels).validate()  # before costs
    slos, origin = _slos(bool(slo), given, configs, deployment, max_sched_delay_p50, capacity_definition)
    _search(CapacityConfig(configs, slos, start_qps, workers, seeds, labels), origin, workload.trace,
            capacity_definition, out)


def _slos(slo_given: bool, given: SLO, configs: list[RunConfig], deployment: Deployment,
          max_sched_delay_p50: float, definition: str) -> tuple[dict[str, SLO], str]:
    """The SLOs searched and where they come from: the one given, else Sarathi-Serve's Table 3 pair."""
    if slo_given:
        return {"given": given}, "given (--slo)"
    return _table3(configs, deployment, max_sched_delay_p50, definition)


def probe_requests(trace: str) -> int:
    """The default requests per probe: DEFAULT_PROBE_REQUESTS, or a shorter trace file's every row (said on
    stderr, as the header does not show it)."""
    from simctl.traces import trace_rows

    rows = trace_rows(trace) if trace.strip() else None
    if rows is None or rows >= DEFAULT_PROBE_REQUESTS:
        return DEFAULT_PROBE_REQUESTS
    print(f"simctl: {trace} has {rows} rows: each probe runs all {rows} (--num-requests; "
          f"{DEFAULT_PROBE_REQUESTS} by default)", file=sys.stderr)
    return rows


def _search(spec: CapacityConfig, origin: str, trace: str, definition: str, out: Path | None) -> None:
    """The searches of `spec`: its SLOs and table printed, its problems warned of, its files in `out`."""
    from rich.markup import escape

    from simctl.plots.capacity_search import capacity_figure
    from simctl.results.output import check_out_dir
    from simctl.studies.capacity import capacity_warnings, search_capacities
    from simctl.studies.capacity_files import CAPACITY_FILES, probes_frame, write_capacity

    if out is not None:
        check_out_dir(out, CAPACITY_FILES)
    console = out_console()
    console.print(escape(f"SLOs: {origin}"))
    for name, s in spec.slos.items():
        console.print(escape(f"  {name}: {s.describe()}"))
    with progress_bar("capacity searches") as report:
        results = search_capacities(spec, report)
    seeds = spec.seeds
    console.print(capacity_table(results, trace, seeds, definition))
    warn_all(capacity_warnings(results))
    warn_all(f"{r.name} ({r.slo_name}{f', seed {seed}' if seeds > 1 else ''}): {problem}"
             + ("; probe more requests (--num-requests) or set a latency SLO (--slo)"
                if r.searches[seed].qps > 0 else "")
             for r in results for seed, problem in r.problems.items())
    if out is not None:
        note_replaced(out, CAPACITY_FILES)
        write_capacity(out, spec, results, origin, capacity_figure(probes_frame(results), results))
        console.print(escape(f"wrote {out}/capacity.json, probes.parquet, capacity.png"))


def _table3(configs: list[RunConfig], deployment: Deployment, max_sched_delay_p50: float,
            definition: str) -> tuple[dict[str, SLO], str]:
    """Sarathi-Serve's strict and relaxed SLOs for the one deployment compared, and where they come from."""
    from dataclasses import replace

    from simctl.results.slo import TABLE3_BATCH, TABLE3_CONTEXT
    from simctl.studies.capacity import table3_slos_for

    if len({(c.model, c.gpu, c.tp) for c in configs}) > 1:
        raise InputError("comparing models, GPUs or TP degrees needs --slo (Table 3's default SLOs "
                         "differ from one deployment to the next)")
    slos, decode = table3_slos_for(configs[0], max_sched_delay_p50)
    origin = ("Sarathi-Serve Table 3 rule: P99 TBT within 5x (strict) and 25x (relaxed) a decode "
              f"iteration of {TABLE3_BATCH} requests with {TABLE3_CONTEXT}-token contexts, "
              f"{decode * 1e3:.2f} ms on {deployment.model} / {deployment.gpu} x{deployment.tp}")
    return {name: replace(s, definition=definition) for name, s in slos.items()}, origin


def capacity_table(results: list[Capacity], trace: str, seeds: int, definition: str) -> Table:
    """One row per configuration and SLO; the title says the capacity's definition, and the refused column
    the share of requests at capacity longer than the max model length."""
    from rich.markup import escape
    from rich.table import Table

    from simctl.results.slo import DEFINITIONS

    spread = seeds > 1
    setups = {(r.config.model, r.config.gpu, r.config.tp) for r in results}
    where = ": {} / {} x{}".format(*next(iter(setups))) if len(setups) == 1 else ""
    title = f"capacity on {trace}{where}" + (f", {median_label(seeds)} of {seeds} seeds" if spread else "")
    ats = [r.median_search.at_capacity for r in results]
    closed = any(r.variable == "concurrency" for r in results)
    what = "concurrency (closed-loop clients, all ready at t=0)" if closed else "rate (QPS)"
    refusing = any(at and at.get("rejected") for at in ats)  # the column only where a request was refused
    table = Table(title=escape(title),
                  caption=escape(f"capacity: the highest {what} meeting the SLO, {definition} definition "
                                 f"({DEFINITIONS[definition]}); "
                                 + ("req/s: the throughput it reached; " if closed else "")
                                 + "P99 TBT, P50 TTFT, saturation"
                                 + (", refused" if refusing else "") + ": the run at capacity"
                                 + ("; refused: its requests longer than the max model length"
                                    if refusing else "")
                                 + "; bound by: the limits the next one probed above the capacity missed"))
    for col in ("config", "SLO", "capacity", *(("min..max",) if spread else ()),
                *(("req/s",) if closed else ()),
                "P99 TBT", "P50 TTFT", "saturation", *(("refused",) if refusing else ()), "bound by",
                "probes"):
        # numbers are never cut: only the two-word headers wrap on a narrow terminal
        table.add_column(col, justify="right", no_wrap=col not in ("P99 TBT", "P50 TTFT"), min_width=6)
    for r, at in zip(results, ats, strict=True):
        shown = (f"{r.qps:d}" if r.variable == "concurrency" and not r.problems else
                 f"{r.qps:.3f}" if not r.problems else
                 f">= {r.qps:.3g}" if r.qps > 0 and r.median_search.problem else
                 "none found" if r.qps == 0 else f"{r.qps:.3f}")
        refused = at.get("rejected", 0) if at else None
        table.add_row(r.name, r.slo_name, shown, *((f"{r.qps_min:.3g}..{r.qps_max:.3g}",) if spread else ()),
                      *((fmt_rate(at["throughput_rps"] if at else None),) if closed else ()),
                      fmt(at.get("tbt_p99") if at else None), fmt(at.get("ttft_p50") if at else None),
                      at["saturation"] if at else "-",
                      *(("-" if refused is None else f"{refused / (refused + at['num_requests']):.1%}",)
                        if refusing else ()),
                      bound_text(r.median_search.bound_by),
                      str(sum(len(s.probes) for s in r.searches.values())))
    return table


BOUND_NAMES = {"sustainable": "sustainability", "unfinished": "unfinished requests",
               "backlogged": "backlog", "sched_delay_p50": "sched delay", "attainment": "attainment"}


def bound_text(missed: list[str]) -> str:
    """The limits that bound a capacity, e.g. "p99_tbt, sched delay"; "-" without a probe above it."""
    return ", ".join(BOUND_NAMES.get(m, m) for m in missed) or "-"


def median_label(seeds: int) -> str:
    """What the capacity of `seeds` searches is: their median, or for an even count the lower of the two
    middle ones (a rate a search found, whose run the table shows)."""
    return "median" if seeds % 2 else "lower median"
