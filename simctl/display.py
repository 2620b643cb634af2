"""The summary table `simctl run` and `simctl real` print."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table


def print_summary(s: dict) -> None:
    console = Console()
    where = f"{s.get('device_name', s['gpu'])} (measured)" if s.get("mode") == "real" else f"{s['gpu']} x{s['tp']}"
    head = (f"{s['policy']} on {s['trace']}: {s['model']} / {where}, "
            f"{fmt_rate(s['offered_qps'])} QPS offered, {s['completed']}/{s['num_requests']} requests")
    table = Table(title=head, show_header=True)
    table.add_column("metric")
    for p in ("p50", "p90", "p99"):
        table.add_column(p, justify="right")
    for name in ("ttft", "tbt", "e2e", "sched_delay"):
        table.add_row(f"{name} (s)", *(fmt(s.get(f"{name}_{p}")) for p in ("p50", "p90", "p99")))
    console.print(table)
    console.print(
        f"throughput {s['throughput_rps']:.3f} req/s, {s['throughput_tokens_per_s']:.0f} output tok/s; "
        f"TPOT p50 {fmt(s['tpot_p50'])} s; makespan {s['makespan_s']:.1f} s; preemptions "
        f"{s['preemptions']}; {'sustainable' if s['sustainable'] else 'UNSUSTAINABLE: the queue keeps growing'}"
        + (f"; served in {s['real_wall_s']:.1f} s" if s.get("mode") == "real"
           else f"; simulated in {s['sim_wall_s']:.2f} s"))



def fmt_rate(v: float | None) -> str:
    return "-" if v is None else f"{v:.3g}"



def fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.4f}"

