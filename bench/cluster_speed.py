"""Cluster simulator speed (issue 10): a 16-replica cluster behind a least-outstanding router, at 70% of 16
times one replica's capacity, for 10k and 100k requests, each in a fresh process so its peak RSS is its own;
and the same at 1k requests, to show memory does not grow with requests' tokens beyond the requests table.
Writes bench/results/cluster_speed.json; `make bench-speed` runs it after bench/sim_speed.py.

Targets: >= 5,000 simulated requests per wall second; 100,000 requests in < 30 s.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

from simctl.traces.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
REPLICAS = 16
POLICY = "vllm"
SIZES = (1_000, 10_000, 100_000)


def worker(n: int, qps: float, scale: float) -> None:
    from simctl.serving.cluster_config import ClusterConfig
    from simctl.sim.run import RunConfig, run

    t0 = time.perf_counter()
    r = run(RunConfig(policy=POLICY, workload=Workload(trace="sharegpt", qps=qps, num_requests=n, seed=0,
                                                       scale=scale)),
            ClusterConfig(replicas=REPLICAS, router="least-outstanding"))
    wall = time.perf_counter() - t0  # trace generation, summaries and per-replica tables included
    print(json.dumps({"wall_s": wall, "requests_per_s": n / wall, "completed": r.summary["completed"],
                      "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                      "iterations": r.summary["iterations"], "iteration_rows": len(r.iterations),
                      "sustainable": r.summary["sustainable"],
                      "tokens": int(r.result.requests.output_tokens.sum())}))


def measure(n: int, qps: float, scale: float = 1.0) -> dict:
    out = subprocess.run([sys.executable, __file__, "--worker", str(n), str(qps), str(scale)], check=True,
                         capture_output=True, text=True, cwd=ROOT)
    return json.loads(out.stdout)


def main() -> None:
    from simctl.results.slo import SLO
    from simctl.sim.run import RunConfig
    from simctl.studies.capacity import find_capacity

    one = find_capacity(RunConfig(policy=POLICY, workload=Workload(trace="sharegpt", num_requests=1000,
                                                                   seed=0)), SLO()).qps
    qps = 0.7 * one * REPLICAS
    rows = [{"requests": n, "scale": 1.0, **measure(n, qps)} for n in SIZES]
    # twice the tokens per request at the same request count: memory must not follow the tokens
    rows.append({"requests": SIZES[-1], "scale": 2.0, **measure(SIZES[-1], qps / 2, 2.0)})
    for r in rows:
        print(f"{r['requests']:>7} requests (lengths x{r['scale']:g}): {r['wall_s']:.2f} s, "
              f"{r['requests_per_s']:,.0f} req/s, peak RSS {r['peak_rss_mb']:.0f} MB, "
              f"{r['tokens']:,} output tokens, "
              f"sustainable {r['sustainable']}")
    out = ROOT / "bench" / "results" / "cluster_speed.json"
    out.write_text(json.dumps({"when": datetime.now(UTC).isoformat(timespec="seconds"),
                               "machine": platform.node(),
                               "policy": POLICY, "replicas": REPLICAS, "router": "least-outstanding",
                               "one_replica_capacity_qps": one, "qps": qps, "runs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # one timed run in this fresh process (main starts these)
    ap.add_argument("--worker", nargs=3, metavar=("REQUESTS", "QPS", "SCALE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(int(args.worker[0]), float(args.worker[1]), float(args.worker[2]))
    else:
        main()
