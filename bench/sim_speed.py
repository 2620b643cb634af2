"""Simulator speed: simulated requests per wall second and peak memory, per policy and trace size.

For each policy: find its capacity on sharegpt (Mistral-7B, A100-80GB, roofline; sustainable with median
scheduling delay <= 2 s), then simulate 1k, 10k and 100k requests at 70% of it, each in a fresh process so
its peak RSS is its own. Also times a whole `simctl run` of 1,000 requests (median of 3). Prints a table and
writes bench/results/sim_speed.json.

Targets (issue 2): >= 10,000 simulated requests per wall second; 1,000-request `simctl run` < 2 s; peak
memory <= 500 MB at 100k requests.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console
from rich.table import Table

from simctl.traces.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
SIZES = (1_000, 10_000, 100_000)
LOAD = 0.7


def worker(policy: str, n: int, qps: float) -> None:
    from simctl.sim.run import RunConfig, run

    t0 = time.perf_counter()
    r = run(RunConfig(policy=policy, workload=Workload(trace="sharegpt", qps=qps, num_requests=n, seed=0)))
    wall = time.perf_counter() - t0  # trace generation and metrics included
    print(json.dumps({
        "wall_s": wall, "sim_loop_s": r.summary["sim_wall_s"],
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "completed": r.summary["completed"], "iterations": r.summary["iterations"],
        "iteration_rows": len(r.result.iterations.count), "sustainable": r.summary["sustainable"],
    }))


def measure(policy: str, n: int, qps: float) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", policy, str(n), str(qps)],
                         check=True, capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)


def time_cli() -> float:
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        subprocess.run([str(Path(sys.executable).parent / "simctl"), "run", "--policy", "sarathi",
                        "--trace", "sharegpt", "--qps", "1", "--num-requests", "1000", "--json"],
                       check=True, capture_output=True, cwd=ROOT)
        walls.append(time.perf_counter() - t0)
    return statistics.median(walls)


def main() -> None:
    from simctl.policies.registry import POLICIES
    from simctl.sim.run import RunConfig
    from simctl.studies.capacity import SLO, find_capacity

    console = Console(width=130)
    rows = []
    for policy in POLICIES:
        with console.status(f"capacity of {policy}"):
            cap = find_capacity(RunConfig(policy=policy, workload=Workload(trace="sharegpt",
                                                                           num_requests=1000)), SLO()).qps
        for n in SIZES:
            with console.status(f"{policy}: {n} requests at {LOAD:.0%} of {cap:.2f} QPS"):
                m = measure(policy, n, LOAD * cap)
            rows.append({"policy": policy, "capacity_qps": cap, "qps": LOAD * cap, "requests": n,
                         "req_per_wall_s": n / m["wall_s"], **m})
    cli_s = time_cli()
    table = Table(title=f"simulator speed: sharegpt, mistral-7b / a100-80gb, {LOAD:.0%} of capacity")
    for col in ("policy", "capacity QPS", "requests", "wall s", "req/s", "peak MB", "iterations", "rows"):
        table.add_column(col, justify="right", no_wrap=True)
    for r in rows:
        table.add_row(r["policy"], f"{r['capacity_qps']:.2f}", f"{r['requests']:,}", f"{r['wall_s']:.2f}",
                      f"{r['req_per_wall_s']:,.0f}", f"{r['peak_rss_mb']:.0f}", f"{r['iterations']:,}",
                      f"{r['iteration_rows']:,}")
    console.print(table)
    console.print(f"`simctl run` (sarathi, sharegpt, 1,000 requests) as a whole process: {cli_s:.2f} s "
                  "(median of 3)")
    out = ROOT / "bench" / "results" / "sim_speed.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "date": datetime.now(UTC).isoformat(timespec="seconds"), "machine": platform.node(),
        "python": platform.python_version(), "load": LOAD, "cli_1000_s": cli_s, "runs": rows}, indent=2)
        + "\n")
    console.print(f"written to {out.relative_to(ROOT)}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # one timed run in this fresh process (main starts these)
    ap.add_argument("--worker", nargs=3, metavar=("POLICY", "REQUESTS", "QPS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], int(args.worker[1]), float(args.worker[2]))
    else:
        main()
