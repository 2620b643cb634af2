"""The summary table `simctl run` and `simctl real` print, a cluster's replicas, and a run's progress bar."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

PIPED_WIDTH = 160  # rich's default for a pipe or file is 80 columns, which cuts and wraps wide tables


def out_console() -> Console:
    """The console a command prints its tables on: the terminal's width, or PIPED_WIDTH when stdout is piped
    or redirected, so that a saved table reads as the screen's does."""
    from rich.console import Console

    return Console(width=None if sys.stdout.isatty() else PIPED_WIDTH)


def print_summary(s: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    console = out_console()
    where = (f"{s.get('device_name', s['gpu'])} (measured)" if s.get("mode") == "real"
             else f"{s['gpu']} x{s.get('gpus', s['tp'])}{_deployment(s)}")
    head = (f"{s.get('vllm_version', s['policy'])} on {s['trace']}: {s['model']} / {where}, "
            f"{_load(s)}, {s['completed']}/{s['num_requests']} requests"
            + (f", {s['rejected']} refused (longer than {s['max_model_len']} positions)" if s.get("rejected")
               else ""))
    table = Table(title=escape(head), show_header=True)  # a trace path is text, not markup
    table.add_column("metric")
    for p in ("p50", "p90", "p99"):
        table.add_column(p, justify="right")
    for name in ("ttft", "tbt", "e2e", "sched_delay"):
        table.add_row(f"{name} (s)", *(fmt(s.get(f"{name}_{p}")) for p in ("p50", "p90", "p99")))
    console.print(table)
    console.print(escape(
        f"throughput {s['throughput_rps']:.3f} req/s, {s['throughput_tokens_per_s']:.0f} output tok/s"
        + (f", {s['in_flight_mean']:.2f} in flight on average" if "in_flight_mean" in s else "")
        + f"; TPOT p50 {fmt(s['tpot_p50'])} s; makespan {s['makespan_s']:.1f} s; preemptions "
        f"{s['preemptions']}; {saturation_text(s)}"
        + (f"; served in {s['real_wall_s']:.1f} s" if s.get("mode") == "real"
           else f"; simulated in {s['sim_wall_s']:.2f} s")))
    for line in judged_lines(s):
        console.print(escape(line))


def _load(s: dict) -> str:
    """The load offered: a rate, or a closed loop's clients (and the rate they were ready at, if given)."""
    if not s.get("concurrency"):
        return f"{fmt_rate(s['offered_qps'])} QPS offered"
    rate = f", ready at {fmt_rate(s['qps'])} QPS" if s.get("qps") else ""
    return f"{s['concurrency']} clients (closed loop{rate}), sent at {fmt_rate(s['offered_qps'])} QPS"


def _deployment(s: dict) -> str:
    """How a cluster's GPUs are deployed, e.g. " (2 replicas of TP2)", " (1P2D)"; "" for one replica."""
    if s.get("prefill_instances"):
        return f" ({s['prefill_instances']}P{s['decode_instances']}D)"
    replicas = s.get("replicas") or 1
    return f" ({replicas} replicas of TP{s['tp']})" if replicas > 1 else ""


def judged_lines(s: dict) -> list[str]:
    """What `--slo` and `--goodput` asked of a run: whether it met the SLO, the share of requests meeting the
    per-request limits, and vLLM's request goodput."""
    lines = []
    if "slo" in s:
        attained = (f"; attainment {s['slo_attainment']:.1%} of requests within the per-request limits"
                    if "slo_attainment" in s else "")
        lines.append(f"SLO {'met' if s['slo_met'] else 'missed'} ({s['slo']}){attained}")
    bench = s.get("vllm_bench") or {}
    if "request_goodput" in bench:
        lines.append(f"goodput {bench['request_goodput']:.3g} requests/s meeting {bench['goodput']} (ms), "
                     f"of {bench['request_throughput']:.3g} completed per second (vLLM bench's definition)")
    return lines



def saturation_text(s: dict) -> str:
    """The run's saturation verdict, with why when it is not stable (an overloaded run is unsustainable)."""
    why = s["saturation_reason"]
    return f"{s['saturation'].upper()}: {why}" if why else s["saturation"]


def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"



def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"


@contextmanager
def progress_bar(what: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress bar on stderr while it is a terminal, fed (done, total); None where nobody would see it.
    With --json too: the JSON goes to stdout, the bar to the terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn(escape(what)), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what, total=None)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def ticker(report: Callable[[int, int], None] | None, total: int) -> Callable[[], None]:
    """A function to call after each of `total` steps that feeds a progress bar's `report` (None: nothing)."""
    done = 0

    def tick() -> None:
        nonlocal done
        done += 1
        if report is not None:
            report(done, total)

    if report is not None:
        report(0, total)
    return tick


def print_cluster(summary: dict[str, Any]) -> None:
    """A cluster run's replicas, one row each, and its KV link's use."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title="replicas")
    cols = ("pool", "replica", "gpu", "requests", "utilisation", "queue_mean", "queue_max", "kv_peak_tokens")
    for c in cols:
        table.add_column(c, justify="right")
    for r in summary["replica_metrics"]:
        table.add_row(*(f"{r[c]:.3f}" if isinstance(r[c], float) else str(r[c]) for c in cols))
    out_console().print(table)
    link = summary.get("kv_link")
    if link:
        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:.1f} ms"

        Console().print(f"KV link {link['gbps']:g} Gbit/s: {link['transfers']} transfers, utilisation "
                        f"{link['utilisation']:.3f}, transfer P50 {ms(link['transfer_s_p50'])}, P99 "
                        f"{ms(link['transfer_s_p99'])} (waiting for the link P99 {ms(link['wait_s_p99'])})")
