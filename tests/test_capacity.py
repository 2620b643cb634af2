"""Capacity search: bisection brackets the highest rate meeting the SLO; the CLI writes its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simctl.sim.run import RunConfig
from simctl.studies.capacity import SLO, find_capacity
from simctl.traces.workload import Workload

pytestmark = pytest.mark.cli


def test_capacity_brackets_the_slo_boundary() -> None:
    slo = SLO({"p99_tbt": 0.5})
    res = find_capacity(RunConfig(policy="vllm", workload=Workload(trace="sharegpt", num_requests=300)),
                        slo, rel_tol=0.05)
    assert res.qps > 0
    met = [p["qps"] for p in res.probes if p["slo_met"]]
    failed = [p["qps"] for p in res.probes if not p["slo_met"]]
    assert max(met) == res.qps
    above = [q for q in failed if q > res.qps]
    assert above and min(above) <= res.qps * 1.05 + 1e-12  # bracketed to the tolerance
    assert res.at_capacity is not None and res.at_capacity["tbt_p99"] <= 0.5


def test_stricter_slo_never_raises_capacity() -> None:
    base = RunConfig(policy="orca", workload=Workload(trace="sharegpt", num_requests=300))
    relaxed = find_capacity(base, SLO({"p99_tbt": 0.5}), rel_tol=0.05).qps
    strict = find_capacity(base, SLO({"p99_tbt": 0.1}), rel_tol=0.05).qps
    assert strict <= relaxed


def test_capacity_cli_writes_json_parquet_png(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    simctl = Path(sys.executable).parent / "simctl"
    proc = subprocess.run([str(simctl), "capacity", "--policy", "vllm,sarathi", "--trace", "sharegpt",
                           "--num-requests", "200", "--slo", "p99_tbt=0.5", "--seeds", "2", "--out",
                           str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    cap = json.loads((out / "capacity.json").read_text())
    assert [(r["policy"], r["slo"]) for r in cap["capacity"]] == [("vllm", "given"), ("sarathi", "given")]
    probes = pd.read_parquet(out / "probes.parquet")
    for row in cap["capacity"]:
        by_seed = {}
        for seed in (0, 1):  # each seed's capacity is the highest rate its search saw meet the SLO
            ok = probes[(probes["policy"] == row["policy"]) & (probes["seed"] == seed) & probes["slo_met"]]
            by_seed[str(seed)] = ok["qps"].max()
        assert row["capacity_qps_by_seed"] == by_seed
        assert row["capacity_qps"] == row["capacity_qps_min"] == min(by_seed.values())  # median_low of two
        assert row["capacity_qps_max"] == max(by_seed.values())
    assert (out / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(("args", "needle"), [
    (("--slo", "-1"), "--slo"), (("--scale", "-1"), "--scale"), (("--slo", "p99_tbt=-1"), "p99_tbt"),
    (("--slo", "p95_tbt=1"), "unknown key 'p95_tbt'"), (("--slo", "p99_tbt"), "key=seconds"),
    (("--slo", "p99_tbt=fast"), "not a number"), (("--slo", "ttft=1", "--attainment", "1.5"), "--attainment"),
    (("--attainment", "0.5"), "--attainment"), (("--seeds", "0"), "--seeds"),
    (("--max-sched-delay-p50", "0"), "--max-sched-delay-p50")])
def test_capacity_cli_rejects_bad_values(tmp_path: Path, args: tuple[str, ...], needle: str) -> None:
    simctl = Path(sys.executable).parent / "simctl"
    proc = subprocess.run([str(simctl), "capacity", *args, "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "x").exists()
