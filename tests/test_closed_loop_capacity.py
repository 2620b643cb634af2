"""Capacity with closed-loop clients (issue 37): the search variable is the concurrency, the highest number
of clients whose run meets the SLO, reported with the throughput it reached."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from simctl.sim.run import RunConfig
from simctl.studies.capacity import SLO, find_capacity, search_concurrency
from simctl.traces.workload import Workload


def _summary(n: int) -> dict[str, Any]:
    """A run whose P99 TBT is n / 100 s, meeting every other limit."""
    return {"sustainable": True, "completed": 1, "num_requests": 1, "saturation": "stable",
            "sched_delay_p50": 0.0, "tbt_p99": n / 100}


@pytest.mark.parametrize("start", [1, 5, 50, 64])
def test_the_search_finds_the_highest_concurrency_meeting_the_slo(start: int) -> None:
    found = search_concurrency(_summary, SLO({"p99_tbt": 0.37}), start, most=1000)
    assert found.qps == 37 and found.variable == "concurrency" and found.problem is None
    probed = {p["concurrency"]: p["slo_met"] for p in found.probes}
    assert probed[37] and not probed[38]  # bisected to one client
    assert found.bound_by == ["p99_tbt"]


def test_a_search_that_never_misses_stops_at_one_client_per_request() -> None:
    found = search_concurrency(_summary, SLO({"p99_tbt": 10.0}), 4, most=100)
    assert found.qps == 100 and found.problem.startswith("no upper bound: every concurrency probed")


def test_a_simulated_search_reports_the_throughput_at_its_concurrency() -> None:
    config = RunConfig(policy="sarathi", model="tiny", gpu="cpu",
                       workload=Workload(trace="sharegpt", qps=None, num_requests=60, scale=0.05,
                                         concurrency=2))
    found = find_capacity(config, SLO({"p50_ttft": 0.05}))
    at = found.at_capacity
    assert found.qps >= 1 and at["concurrency"] == found.qps and at["ttft_p50"] <= 0.05
    assert at["throughput_rps"] > 0 and at["qps"] is None  # every request ready at t=0
    assert any(p["concurrency"] == found.qps + 1 and not p["slo_met"] for p in found.probes)


SIMCTL = Path(sys.executable).parent / "simctl"


@pytest.mark.cli
def test_capacity_cli_searches_the_concurrency(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    proc = subprocess.run([str(SIMCTL), "capacity", "--policy", "sarathi", "--model", "tiny", "--gpu", "cpu",
                           "--trace", "sharegpt", "--scale", "0.05", "--num-requests", "100",
                           "--concurrency", "2", "--slo", "p50_ttft=0.05", "--workers", "1",
                           "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert "highest concurrency" in proc.stdout
    row = json.loads((out / "capacity.json").read_text())["capacity"][0]
    assert row["capacity_concurrency"] >= 1 and row["throughput_rps_at_capacity"] > 0
    assert "capacity_qps" not in row


@pytest.mark.cli
@pytest.mark.parametrize("args", [("plan", "--rate", "5", "--slo", "p99_tbt=0.1"),
                                  ("capacity", "--goodput", "--slo", "p99_tbt=0.1")])
def test_plan_and_a_clusters_capacity_refuse_a_closed_loop_in_one_line(args: tuple[str, ...]) -> None:
    proc = subprocess.run([str(SIMCTL), *args, "--concurrency", "4"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "--concurrency" in proc.stderr
    assert "Traceback" not in proc.stderr
