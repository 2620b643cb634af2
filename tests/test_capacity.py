"""Capacity search: bisection brackets the highest rate meeting the SLO; the CLI writes its files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from sim.capacity import SLO, find_capacity
from sim.run import RunConfig


def test_capacity_brackets_the_slo_boundary() -> None:
    slo = SLO(tbt_p99_s=0.5)
    res = find_capacity(RunConfig(policy="vllm", trace="sharegpt", num_requests=300), slo, rel_tol=0.05)
    assert res.qps > 0
    met = [p["qps"] for p in res.probes if p["slo_met"]]
    failed = [p["qps"] for p in res.probes if not p["slo_met"]]
    assert max(met) == res.qps
    above = [q for q in failed if q > res.qps]
    assert above and min(above) <= res.qps * 1.05 + 1e-12  # bracketed to the tolerance
    assert res.at_capacity is not None and res.at_capacity["tbt_p99"] <= 0.5


def test_stricter_slo_never_raises_capacity() -> None:
    base = RunConfig(policy="orca", trace="sharegpt", num_requests=300)
    relaxed = find_capacity(base, SLO(tbt_p99_s=0.5), rel_tol=0.05).qps
    strict = find_capacity(base, SLO(tbt_p99_s=0.1), rel_tol=0.05).qps
    assert strict <= relaxed


def test_capacity_cli_writes_json_csv_png(tmp_path: Path) -> None:
    out = tmp_path / "cap"
    simctl = Path(sys.executable).parent / "simctl"
    proc = subprocess.run([str(simctl), "capacity", "--policy", "vllm,sarathi", "--trace", "sharegpt",
                           "--num-requests", "200", "--slo-tbt-p99", "0.5", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    cap = json.loads((out / "capacity.json").read_text())
    assert set(cap["capacity_qps"]) == {"vllm", "sarathi"}
    probes = pd.read_csv(out / "probes.csv")
    for policy, qps in cap["capacity_qps"].items():
        ok = probes[(probes["policy"] == policy) & probes["slo_met"]]
        assert ok["qps"].max() == qps
    assert (out / "capacity.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("option", ["--slo-tbt-p99", "--scale"])
def test_capacity_cli_rejects_bad_values(tmp_path: Path, option: str) -> None:
    simctl = Path(sys.executable).parent / "simctl"
    proc = subprocess.run([str(simctl), "capacity", option, "-1", "--out", str(tmp_path / "x")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and option in proc.stderr
    assert not (tmp_path / "x").exists()
