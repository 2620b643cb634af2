"""Cluster options misused (issue 10): one line on stderr, exit 2, nothing written (refused in-process:
`simctl_here`); and a plain run is a cluster of one (`simctl` run as a child, as a user runs it)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import simctl_here

pytestmark = pytest.mark.cli

SIMCTL = Path(sys.executable).parent / "simctl"
BASE = ("run", "--policy", "vllm", "--trace", "sharegpt", "--num-requests", "20", "--qps", "2")
PD = ("--prefill-instances", "1", "--decode-instances", "1")

CASES = {
    "zero replicas": (("--replicas", "0"), "--replicas must be an integer from 1"),
    "zero prefill instances": (("--prefill-instances", "0", "--decode-instances", "1",
                                "--kv-link-gbps", "10"),
                               "--prefill-instances must be an integer from 1"),
    "zero decode instances": (("--prefill-instances", "1", "--decode-instances", "0", "--kv-link-gbps", "10"),
                              "--decode-instances must be an integer from 1"),
    "link of 0 Gbps": ((*PD, "--kv-link-gbps", "0"), "--kv-link-gbps must be a finite number > 0"),
    "negative link": ((*PD, "--kv-link-gbps", "-5"), "--kv-link-gbps must be a finite number > 0"),
    "no link": (PD, "needs --kv-link-gbps"),
    "one pool only": (("--prefill-instances", "2", "--kv-link-gbps", "10"), "needs both"),
    "unknown router": (("--replicas", "2", "--router", "fastest"), "unknown --router 'fastest'"),
    "link without disaggregation": (("--kv-link-gbps", "10"), "--kv-link-gbps needs --prefill-instances"),
    "replicas and pools": (("--replicas", "2", *PD, "--kv-link-gbps", "10"), "--replicas is for colocated"),
    "GPU that cannot hold the model": ((*PD, "--kv-link-gbps", "10", "--model", "yi-34b", "--scale", "0.2",
                                        "--decode-gpu", "l4"), "does not fit on l4"),
    "unknown decode GPU": ((*PD, "--kv-link-gbps", "10", "--decode-gpu", "tpu"), "unknown GPU 'tpu'"),
    "pool TP without disaggregation": (("--decode-tp", "2"), "--decode-tp needs --prefill-instances"),
    "pool TP of 0": ((*PD, "--kv-link-gbps", "10", "--prefill-tp", "0"),
                     "--prefill-tp must be an integer >= 1"),
    "pool TP the model refuses": ((*PD, "--kv-link-gbps", "10", "--prefill-tp", "3"),
                                  "--prefill-tp 3: tp=3 must divide"),
    "padded policy disaggregated": ((*PD, "--kv-link-gbps", "10", "--policy", "faster-transformer"),
                                    "cannot serve disaggregated"),
}


def simctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SIMCTL), *args], check=False, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("case", list(CASES))
def test_bad_cluster_input_is_one_line_exit_2(tmp_path: Path, case: str) -> None:
    out = tmp_path / "out"
    res = simctl_here(*BASE, *CASES[case][0], "--out", out)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("simctl: error: "), res.stderr
    assert CASES[case][1] in res.stderr, res.stderr
    assert not out.exists()


def test_one_replica_is_a_cluster_of_one_whatever_its_router() -> None:
    plain, one = (json.loads(simctl(*BASE, *extra, "--json").stdout)
                  for extra in ((), ("--replicas", "1", "--router", "least-kv")))
    plain.pop("sim_wall_s"), one.pop("sim_wall_s")
    assert plain.pop("router") == "round-robin" and one.pop("router") == "least-kv"
    assert plain == one and plain["replicas"] == plain["gpus"] == len(plain["replica_metrics"]) == 1


def test_cluster_run_writes_replicas_table(tmp_path: Path) -> None:
    import pandas as pd

    res = simctl(*BASE, "--replicas", "3", "--router", "least-outstanding", "--out", str(tmp_path / "o"))
    assert res.returncode == 0, res.stderr
    replicas = pd.read_parquet(tmp_path / "o" / "replicas.parquet")
    summary = json.loads((tmp_path / "o" / "summary.json").read_text())
    assert list(replicas["replica"]) == [0, 1, 2] and replicas["requests"].sum() == 20
    assert summary["completed"] == 20 and len(summary["replica_metrics"]) == 3 and summary["gpus"] == 3
    assert set(pd.read_parquet(tmp_path / "o" / "requests.parquet")["replica"]) <= {0, 1, 2}


GOODPUT_CASES = {
    "goodput without an SLO": (("capacity", "--policy", "vllm", "--trace", "sharegpt", "--num-requests",
                                "100", "--goodput"), "needs --slo"),
    "cluster capacity without an SLO": (("capacity", "--policy", "vllm", "--trace", "sharegpt",
                                         "--num-requests", "100", "--replicas", "2"), "needs --slo"),
    "attainment without per-request limits": ((*BASE, "--slo", "p99_tbt=0.1", "--attainment", "0.9"),
                                              "--attainment applies to per-request"),
    "bad SLO key": ((*BASE, "--slo", "ttft=1,speed=2"), "unknown key 'speed'"),
}


@pytest.mark.parametrize("case", list(GOODPUT_CASES))
def test_bad_goodput_input_is_one_line_exit_2(case: str) -> None:
    args, words = GOODPUT_CASES[case]
    res = simctl_here(*args)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.count("\n") == 1 and words in res.stderr, res.stderr
