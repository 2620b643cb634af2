"""`simctl validate --engine vllm`: the vllm-v1 twin against the installed vLLM on identical requests.

A smoke validation (one engine start, one load, 100 short requests) checks the pipeline, not the cost model's
accuracy (that is `bench/validate_vllm.py`'s): the twin is configured from the settings vLLM resolved, both
sides serve the same requests, the errors are the files' own values, and every run's files are written.
Misuse is one line, exit 2, before vLLM starts.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from conftest import TinyCost, sharing, simctl_here

from simctl.costs.base import ScaledCost
from simctl.results.validation_report import pct_error
from simctl.studies.capacity import SLO
from simctl.traces.workload import Workload
from simctl.validation.vllm_validate import (
    FIT_SPEED_TOL,
    METRICS,
    VLLMValidation,
    simulate_requests,
    validate_vllm,
)

pytestmark = pytest.mark.vllm

SHIPPED_CPU_FIT = (Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu"
    / "cost_model.json")


@pytest.mark.parametrize(("args", "words"), [
    (("--engine", "vllm", "--device", "cpu", "--cost", "x.json"), "--device applies to --engine simctl"),
    (("--engine", "vllm", "--policy", "vllm"), "the twin is vllm-v1"),
    (("--engine", "vllm", "--threads", "1"), "--threads applies to --engine simctl"),
    (("--engine", "tgi",), "choose simctl or vllm"),
    (("--engine", "vllm"), "needs --cost"),
    (("--engine", "vllm", "--cost", str(SHIPPED_CPU_FIT)), "not of vLLM's steps"),
    (("--engine", "vllm", "--cost", "missing.json"), "no such file"),
])
def test_misuse_is_one_line_exit_2(tmp_path: Path, args: tuple[str, ...],
                                   words: str) -> None:
    res = simctl_here("validate", *args, "--out", tmp_path / "v", cwd=tmp_path)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0], res.stderr
    assert not (tmp_path / "v").exists()


VALIDATION = {"loads": (0.5,), "slo": SLO({"p50_ttft": 0.01}),
              "workload": Workload(trace="sharegpt", qps=None, num_requests=100, scale=0.02)}


@pytest.fixture(scope="module")
def validated(tmp_path_factory: pytest.TempPathFactory, vllm_server) -> tuple[dict, Path]:
    out = tmp_path_factory.mktemp("vv") / "val"
    # a tight TTFT limit keeps the twin's capacity, and so the real run, short
    v = VLLMValidation(cost=TinyCost(), out=out, **VALIDATION)
    with sharing(vllm_server):  # the session's engine: the validation's deployment is vLLM's defaults too
        return validate_vllm(v), out


def test_the_twin_is_configured_as_vllm_resolved_its_settings(validated: tuple[dict, Path]) -> None:
    report, out = validated
    engine = report["config"]["engine"]
    sim = json.loads((out / "runs" / "load_0.5" / "sim" / "summary.json").read_text(encoding="utf-8"))
    real = json.loads((out / "runs" / "load_0.5" / "real" / "summary.json").read_text(encoding="utf-8"))
    assert sim["policy"] == real["policy"] == "vllm-v1"
    for key in ("max_num_batched_tokens", "block_size", "enable_prefix_caching",
                "long_prefill_token_threshold"):
        assert sim[key] == engine[key] == real[key]
    assert sim["max_batch_size"] == engine["max_num_seqs"]
    assert sim["kv_capacity_tokens"] == (engine["num_gpu_blocks"] - 1) * engine["block_size"]  # null block


def test_both_sides_serve_identical_requests_and_every_one_finishes(validated: tuple[dict, Path]) -> None:
    _, out = validated
    frames = {side: pd.read_parquet(out / "runs" / "load_0.5" / side / "requests.parquet")
              for side in ("real", "sim")}
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    real, sim = (frames[s].sort_values("request_id")[cols].reset_index(drop=True) for s in ("real", "sim"))
    pd.testing.assert_frame_equal(real, sim)
    assert len(real) == 100
    for frame in frames.values():
        assert (frame["completion_s"] >= frame["first_token_s"]).all()
        assert (frame["first_token_s"] >= frame["arrival_s"]).all()


def validated_twin(report: dict, speed: float) -> dict:
    """The twin of the validation's run at `speed` times the cost, rebuilt from its report."""
    requests = VLLMValidation(**VALIDATION).requests_at(report["rows"][0]["qps"])
    return simulate_requests(requests, report["config"]["engine"], ScaledCost(TinyCost(), speed))[0]


def test_errors_are_the_runs_own_values(validated: tuple[dict, Path]) -> None:
    report, out = validated
    (row,) = report["rows"]
    real = json.loads((out / "runs" / "load_0.5" / "real" / "summary.json").read_text(encoding="utf-8"))
    sim = json.loads((out / "runs" / "load_0.5" / "sim" / "summary.json").read_text(encoding="utf-8"))
    assert row["qps"] == pytest.approx(0.5 * report["capacity"]["sim_qps"])
    for m in METRICS:
        assert row[f"real_{m}"] == pytest.approx(real[m])  # one round: the median is the run
        assert row[f"sim_{m}"] == pytest.approx(sim[m])
        expected = pct_error(sim[m], real[m])
        assert row[f"{m}_err_pct"] == (pytest.approx(expected) if expected is not None else None)
    (speed,) = report["speed_factors"]  # the run's busy time over the twin's price of its steps
    assert speed > 0
    twin = validated_twin(report, speed)
    for m in METRICS:
        expected = pct_error(twin[m], real[m])
        assert row[f"{m}_err_pct_at_speed"] == (pytest.approx(expected) if expected is not None else None)
    at_fit_speed = abs(speed - 1) <= FIT_SPEED_TOL  # then the run is compared with the raw twin too
    assert row["runs_at_fit_speed"] == int(at_fit_speed)
    for m in METRICS:
        assert row[f"{m}_err_pct_at_fit_speed"] == (row[f"{m}_err_pct"] if at_fit_speed else None)
    md = (out / "validation_vllm.md").read_text(encoding="utf-8")
    assert "| 0.5 | P50 ITL |" in md and "Twin capacity" in md
    assert len(pd.read_csv(out / "validation_vllm.csv")) == 1
