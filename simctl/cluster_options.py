"""`simctl run`'s cluster options (replicas behind a router, disaggregated prefill and decode) and what `run`
does with them: a decorator adds the options and hands them to the command as one `cluster` argument, and
`run_command` simulates that deployment (one replica by default) and writes its one set of files."""

from __future__ import annotations

import functools
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, get_type_hints

import typer

from common.errors import InputError
from serving.routers import ROUTERS

OPTIONS: dict[str, tuple[Any, Any, str]] = {  # name: (type, default, help)
    "replicas": (int, 1, "Replicas of the deployment behind a router (each its own policy and KV)."),
    "router": (str, "round-robin", f"How a request picks its replica at its arrival: {', '.join(ROUTERS)}."),
    "prefill_instances": (int | None, None, ("Disaggregated serving: instances that only prefill (with "
                          "--decode-instances and --kv-link-gbps).")),
    "decode_instances": (int | None, None, ("Disaggregated serving: instances that only decode, admitting "
                         "requests whose KV has crossed the link.")),
    "prefill_gpu": (str | None, None, "GPU of the prefill instances [default: --gpu]."),
    "decode_gpu": (str | None, None, "GPU of the decode instances [default: --gpu]."),
    "prefill_tp": (int | None, None, ("Tensor-parallel degree of each prefill instance (its GPUs) [default: "
                   "--tp].")),
    "decode_tp": (int | None, None, "Tensor-parallel degree of each decode instance [default: --tp]."),
    "kv_link_gbps": (float | None, None, ("Bandwidth of the link prefill instances send KV over, Gbit/s "
                     "(one transfer at a time, first come first served; a request's whole KV crosses it "
                     "whatever the two pools' TP degrees).")),
}


SLO_OPTIONS: dict[str, tuple[Any, Any, str]] = {
    "slo": (list[str] | None, None, ("SLO limits, KEY=SECONDS[,KEY=SECONDS] (results/slo.py's grammar, as "
            "`capacity --slo`): per-request ttft, tbt, tpot, e2e (the summary's slo_attainment is the share "
            "of requests meeting all of them) or percentiles such as p99_tbt; slo_met says whether the run "
            "meets them.")),
    "attainment": (float | None, None, ("Share of requests that must meet the per-request --slo limits "
                   "[default: 0.9].")),
}
GOODPUT_OPTION = (bool, False, ("Goodput (DistServe): the highest rate meeting --slo on the deployment the "
                  "cluster options describe, per GPU it uses; writes goodput.json to --out."))


def with_cluster_options(slo: bool = False,
                         goodput: bool = False) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the cluster options, received as `cluster` (a ClusterConfig); with `slo`, also --slo and
    --attainment, received as `slo` (an SLO, or None); with `goodput`, the --goodput flag."""
    extra = {**(SLO_OPTIONS if slo else {}), **({"goodput": GOODPUT_OPTION} if goodput else {})}

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command)
        hints = get_type_hints(command, include_extras=True)
        own = ("cluster", *extra)  # what this decorator gives the command
        params = [p.replace(annotation=hints[p.name]) for p in signature.parameters.values()
                  if p.name not in own]
        annotations = {p.name: p.annotation for p in params}
        for name, (kind, default, text) in {**OPTIONS, **extra}.items():
            option = (typer.Option(help=text, metavar="KEY=S[,KEY=S]") if name == "slo"
                      else typer.Option(help=text))
            annotation = Annotated[kind, option]
            params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default,
                                            annotation=annotation))
            annotations[name] = annotation

        @functools.wraps(command)
        def wrapper(**kwargs: Any) -> Any:
            from results.slo import parse_slo
            from sim.cluster_run import ClusterConfig

            cluster = ClusterConfig(**{n: kwargs.pop(n) for n in OPTIONS})
            if slo:
                limits, share = kwargs.pop("slo"), kwargs.pop("attainment")
                kwargs["slo"] = parse_slo(limits, share) if limits or share is not None else None
            return command(**kwargs, cluster=cluster)

        wrapper.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
        wrapper.__annotations__ = annotations
        return wrapper

    return decorate


def run_command(config: Any, cluster: Any, out: Path | None, as_json: bool, timeline: int,
                trace_events: Path | None, goodput: Any = None, slo: Any = None) -> None:
    """`simctl run` once its options are read: summary.json, requests.parquet, iterations.parquet (with pool
    and replica columns), replicas.parquet and, with --timeline, timeline.parquet in --out."""
    from results.output import TIMELINE_FILE, check_out_dir, json_text
    from results.trace_events import MAX_EVENTS, check_trace_path, write_trace_events
    from results.vllm_bench import with_goodput
    from sim.cluster_run import CLUSTER_RUN_FILES, write_cluster_files
    from sim.run import run
    from sim.timeline import check_timeline
    from simctl.display import print_summary, progress_bar
    from simctl.usage_errors import note_replaced, warn_all
    from studies.goodput import with_attainment

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
        check_trace_path(trace_events)
    with progress_bar(f"{config.policy}: requests arrived") as report:
        result = run(config, cluster, progress=report, timeline=timeline)
    result.summary = with_attainment(result.summary, result.result.requests, slo)
    result.summary = with_goodput(result.summary, result.result.requests, goodput)
    warn_all(result.summary.get("warnings", []))
    if out is not None:
        note_replaced(out, files)
        write_cluster_files(out, result.summary, result.result.requests, result.iterations, result.replicas,
                            result.timeline)
    if trace_events is not None:
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


def print_cluster(summary: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="replicas")
    cols = ("pool", "replica", "gpu", "requests", "utilisation", "queue_mean", "queue_max", "kv_peak_tokens")
    for c in cols:
        table.add_column(c, justify="right")
    for r in summary["replica_metrics"]:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    Console().print(table)
    link = summary.get("kv_link")
    if link:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.1f} ms"

        Console().print(f"KV link {link['gbps']:g} Gbit/s: {link['transfers']} transfers, utilisation "
                        f"{link['utilisation']:.3f}, transfer P50 {ms(link['transfer_s_p50'])}, P99 "
                        f"{ms(link['transfer_s_p99'])} (waiting for the link P99 {ms(link['wait_s_p99'])})")
