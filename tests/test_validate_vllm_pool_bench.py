"""bench/validate_vllm_pool.py: each real run of several validations paired with its own speed factor (no
vLLM needed)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import bench_module

pytestmark = pytest.mark.unit

pool = bench_module("validate_vllm_pool")


def _validation(root: Path, speeds: list[float | None], rounds: int) -> Path:
    """A validation at loads 0.5 and 0.9 whose round k's run at load x has P50 TTFT k + x seconds."""
    d = root / "validation"
    for k in range(rounds):
        for load in (0.5, 0.9):
            run = d / "runs" / f"load_{load:g}" / ("real" if k == 0 else f"real_{k + 1}")
            run.mkdir(parents=True)
            (run / "summary.json").write_text(json.dumps({"ttft_p50": k + load}), encoding="utf-8")
    report = {"config": {"cost": "fit.json"}, "capacity": {"sim_qps": 10.0, "real_qps": 9.0},
              "rows": [{"load": 0.5, "qps": 5.0}, {"load": 0.9, "qps": 9.0}], "speed_factors": speeds}
    report["config"]["repeats"] = rounds
    (d / "validation_vllm.json").write_text(json.dumps(report), encoding="utf-8")
    return d


def test_runs_keep_their_rounds_speed_factors_across_validations(tmp_path: Path) -> None:
    # rounds of loads in order: (0.5, 0.9) x 11 rounds, so round 10's folder (real_11) sorts before real_2's
    speeds = [1.0 + k / 100 + (0.5 if load == 0.9 else 0) for k in range(11) for load in (0.5, 0.9)]
    speeds[2] = None  # round 1 at load 0.5 had no busy step
    first = _validation(tmp_path / "a", speeds, 11)
    second = _validation(tmp_path / "b", [0.9, 0.8], 1)
    cfg, loads = pool.pooled([first, second])
    assert cfg["runs"] == 12 and cfg["real_capacities"] == [9.0, 9.0]
    (load, qps, runs, got), (load9, _, runs9, got9) = loads
    assert (load, qps, load9) == (0.5, 5.0, 0.9)
    assert [r["ttft_p50"] for r in runs] == [k + 0.5 for k in range(11)] + [0.5]
    assert got == [1.0, None] + [1.0 + k / 100 for k in range(2, 11)] + [0.9]
    assert [r["ttft_p50"] for r in runs9] == [k + 0.9 for k in range(11)] + [0.9]
    assert got9 == [1.5 + k / 100 for k in range(11)] + [0.8]
