"""`simctl run`: one deployment simulated (one replica unless the cluster options say more), its summary
printed and its one set of files written; with comma lists, one row per combination
(`simctl.run_grid_cmd`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simctl.common.errors import InputError
from simctl.configs import Deployment, Execution, Workload
from simctl.options import Attainment
from simctl.policy_options import PolicyLists
from simctl.serving.cluster_config import ClusterConfig

if TYPE_CHECKING:
    from simctl.results.slo import SLO
    from simctl.results.vllm_bench import GoodputLimits
    from simctl.sim.run import RunConfig

DEFAULT_NUM_REQUESTS = 1000
DEFAULT_QPS = 0.5


def run(
    policies: PolicyLists = PolicyLists(policy="sarathi"),
    workload: Workload = Workload(trace="arxiv", qps=None, num_requests=None),
    deployment: Deployment = Deployment(),
    execution: Execution = Execution(),
    out: Annotated[Path | None, typer.Option(help=(
        "Folder for summary.json, requests.parquet, iterations.parquet and "
        "replicas.parquet (one row per replica)."))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    timeline: Annotated[int, typer.Option(help="Also record which requests the first N iterations ran "
                                          "(timeline.parquet in --out, for `simctl plot timeline`).")] = 0,
    trace_events: Annotated[Path | None, typer.Option(help="Write the iterations as a Chrome/Perfetto trace "
                                                      "(JSON trace events) to this file (an existing file "
                                                      "only if it is an earlier trace).")] = None,
    goodput: Annotated[list[str] | None, typer.Option(metavar="KEY:MS[,KEY:MS]", help=(
        "vLLM bench's --goodput: per-request limits on ttft, tpot and e2el in ms unless a unit is given "
        "(e.g. ttft:500,tpot:50 or ttft:0.5s,tpot:50ms, or the option repeated); adds "
        "vllm_bench.request_goodput to the summary, the requests meeting all of them per second, as vLLM "
        "computes it."))] = None,
    cluster: ClusterConfig = ClusterConfig(),
    slo: Annotated[list[str] | None, typer.Option(metavar="KEY=S[,KEY=S]", help=(
        "SLO limits, KEY=SECONDS[,KEY=SECONDS] (seconds unless a unit is given: p99_tbt=0.1 or "
        "p99_tbt=100ms; results/slo.py's grammar, as `capacity --slo`): per-request "
        "ttft, tbt, tpot, e2e (the summary's slo_attainment is the share of requests meeting all of them) or "
        "percentiles such as p99_tbt; slo_met says whether the run meets them."))] = None,
    attainment: Attainment = None,
) -> None:
    """Simulate a deployment (one replica unless the cluster options say more) and print its latency and
    throughput summary; with comma lists, one row per combination.

    Example: simctl run --policy vllm --trace sharegpt --qps 2 --out out/vllm; compared: simctl run --policy
    sarathi --token-budget 256,512,1024 --trace sharegpt --qps 2
    """
    from simctl.option_grid import base_config, grid
    from simctl.results.slo import parse_slo
    from simctl.results.vllm_bench import parse_goodput

    judged = parse_slo(slo, attainment) if slo or attainment is not None else None
    base = base_config(workload.resolved(DEFAULT_QPS, DEFAULT_NUM_REQUESTS), deployment, execution)
    combos = grid(base, policies.policy, deployment, policies.settings())
    if len(combos) > 1:
        from simctl.run_grid_cmd import check_single_outputs, run_grid  # its table's rich: not for --json
        check_single_outputs(out=out, json=as_json, timeline=timeline, trace_events=trace_events,
                             goodput=goodput)
        return run_grid(combos, cluster, judged)
    run_command(combos[0].config, cluster, out, as_json, timeline, trace_events, parse_goodput(goodput),
                judged)


def run_command(config: RunConfig, cluster: ClusterConfig, out: Path | None, as_json: bool, timeline: int,
                trace_events: Path | None, goodput: GoodputLimits | None = None, slo: SLO | None = None
                ) -> None:
    """`simctl run` once its options are read: summary.json, requests.parquet, iterations.parquet (with pool
    and replica columns), replicas.parquet and, with --timeline, timeline.parquet in --out."""
    from simctl.display import print_cluster, print_summary, progress_bar
    from simctl.results.output import (
        CLUSTER_RUN_FILES,
        TIMELINE_FILE,
        check_out_dir,
        json_text,
        write_cluster_files,
    )
    from simctl.results.trace_events import MAX_EVENTS, check_trace_path, write_trace_events
    from simctl.results.vllm_bench import with_goodput
    from simctl.sim.run import run
    from simctl.sim.timeline import check_timeline
    from simctl.studies.goodput import with_attainment
    from simctl.usage_errors import note_replaced, warn_all

    config.validate()  # the options' errors first, before those of the outputs
    cluster.validate(config.policy)
    for name, given in (("timeline", timeline), ("trace-events", trace_events)):
        if given and cluster.is_cluster:
            raise InputError(f"--{name} records one replica; it is not available with a cluster")
    check_timeline(timeline)
    if timeline and out is None:
        raise InputError("--timeline needs --out (it writes timeline.parquet there)")
    files = (*CLUSTER_RUN_FILES, TIMELINE_FILE)
    if out is not None:  # fail before the run, and create nothing until it has succeeded
        check_out_dir(out, files)
    if trace_events is not None:
        check_trace_path(trace_events, {"--trace": config.workload.trace, "--model": config.model,
                                        "--cost": config.cost})
        if out is not None and trace_events.absolute().parent == Path(out).absolute():
            raise InputError(f"--trace-events {trace_events}: is in --out {out}, which holds only the run's "
                             "files; give a file elsewhere")
    with progress_bar(f"{config.policy}: requests arrived") as report:
        result = run(config, cluster, progress=report, timeline=timeline)
    result.summary = with_attainment(result.summary, result.result.request_columns, slo)
    result.summary = with_goodput(result.summary, result.result.request_columns, goodput)
    warn_all(result.summary.get("warnings", []))
    if out is not None:
        note_replaced(out, files)
        write_cluster_files(out, result.summary, result.result.requests, result.iterations, result.replicas,
                            result.timeline)
    if trace_events is not None:
        note_replaced(trace_events.parent, (trace_events.name,))
        its = result.result.iterations.frame()
        if write_trace_events(trace_events, its, result.summary):
            warn_all([(f"--trace-events: only the first {MAX_EVENTS} of {len(its)} iteration rows "
                       "were written")])
    if as_json:
        sys.stdout.write(json_text(result.summary))
        return
    print_summary(result.summary)
    if len(result.summary["replica_metrics"]) > 1:
        print_cluster(result.summary)
