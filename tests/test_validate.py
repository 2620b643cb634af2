"""`validation.validate`: a tiny end-to-end validation (one policy, one load, two real runs against their
simulated twin: conftest's `validated`) writes its files with sane values; bad input fails before anything
runs."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import TinyCost

from simctl.common.errors import InputError
from simctl.results.validation_report import METRICS
from simctl.studies.capacity import SLO, search_qps
from simctl.traces.workload import Workload
from simctl.validation.validate import rescore, validate_main

pytestmark = pytest.mark.torch

MODEL = "tiny-2l"


@pytest.fixture(scope="module")
def cost():
    return TinyCost()


def test_validate_end_to_end(validated):
    report, out = validated
    for name in ("validation.csv", "validation.md", "validation.png", "validation.json"):
        assert (out / name).is_file() and (out / name).stat().st_size > 0
    assert (out / "validation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    cap = report.capacity["sarathi"]
    assert cap["sim_qps"] > 0 and cap["sim_fail_qps"] > cap["sim_qps"]
    frame = pd.read_csv(out / "validation.csv")
    assert len(frame) == 1
    row = frame.iloc[0]
    assert row["policy"] == "sarathi" and row["load"] == 0.5
    assert row["qps"] == pytest.approx(0.5 * cap["sim_qps"])
    for m in METRICS:
        assert math.isfinite(row[f"{m}_real"]) and row[f"{m}_real"] > 0
        assert math.isfinite(row[f"{m}_sim"]) and row[f"{m}_sim"] > 0
        err = row[f"{m}_err_pct"]
        assert math.isfinite(err) and err == pytest.approx(100 * (row[f"{m}_sim"] - row[f"{m}_real"])
                                                          / row[f"{m}_real"])
    assert bool(row["identical_requests"])
    assert row["real_completed"] == row["sim_completed"] == 100

    # two real runs: each measured metric is their median (with two: their mean), min and max kept
    run = out / "runs" / "sarathi" / "load_0.5"
    runs = [json.loads((run / d / "summary.json").read_text()) for d in ("real", "real_2")]
    for m in METRICS:
        values = sorted(s[m] for s in runs)
        assert (row[f"{m}_real_min"], row[f"{m}_real_max"]) == pytest.approx(values, rel=1e-12)
        assert row[f"{m}_real"] == pytest.approx(sum(values) / 2, rel=1e-12)

    # the real runs and their twin served identical requests
    real = pd.read_parquet(run / "real" / "requests.parquet").sort_values("request_id").reset_index(drop=True)
    sim = pd.read_parquet(run / "sim" / "requests.parquet").sort_values("request_id").reset_index(drop=True)
    for col in ("request_id", "prompt_tokens", "output_tokens", "arrival_s"):
        assert real[col].tolist() == sim[col].tolist()
    summary = json.loads((run / "sim" / "summary.json").read_text())
    assert summary["mode"] == "sim" and summary["qps"] == pytest.approx(row["qps"])

    # the replay re-planned every real iteration of both runs, priced it, and rebuilt the real TBT gaps
    ev = report.evidence[0]
    assert ev["replay_matched"] == ev["iterations"] == sum(s["iterations"] for s in runs)
    assert ev["replay_tbt_matches"]
    assert ev["real_busy_s"] > 0 and ev["repriced_busy_s"] > 0 and ev["sim_busy_s"] > 0
    replay = pd.read_parquet(run / "replay.parquet")
    assert len(replay) == ev["iterations"] and (replay["predicted_s"] > 0).all()
    assert replay.groupby("repeat").size().tolist() == [s["iterations"] for s in runs]

    md = (out / "validation.md").read_text()
    assert "| sarathi | 0.5 |" in md and "P50 TTFT" in md and "Per-iteration evidence" in md
    assert "Run-to-run spread" in md


def test_validate_records_the_device_and_sizes_twins_as_the_real_runs(validated):
    """The default device and dtype (cpu, float32: the hand-made model records no dtype) reach the real runs
    and the records; each twin has its real run's KV sizing."""
    from simctl.engine.real import CPU_KV_BYTES
    from simctl.executor.runtime import cpu_name

    _, out = validated
    c = json.loads((out / "validation.json").read_text())["config"]
    assert (c["device"], c["device_name"], c["dtype"], c["kv_budget_bytes"]) == ("cpu", cpu_name(), "float32",
                                                                                CPU_KV_BYTES)
    assert f"on {cpu_name()} (cpu, float32, 1 CPU thread(s))" in (out / "validation.md").read_text()
    run = out / "runs" / "sarathi" / "load_0.5"
    sim = json.loads((run / "sim" / "summary.json").read_text())
    for d in ("real", "real_2"):
        real = json.loads((run / d / "summary.json").read_text())
        assert (real["device"], real["dtype"], real["kv_budget_bytes"]) == ("cpu", "float32", CPU_KV_BYTES)
        for k in ("kv_capacity_tokens", "max_seq_len", "max_batch_size"):
            assert sim[k] == real[k], k


def test_rescore_reuses_the_real_runs(validated, cost, tmp_path):
    """Scoring the same cost model again from the recorded real runs reproduces the report exactly."""
    report, out = validated
    again = rescore(out, cost, tmp_path / "again")
    assert (tmp_path / "again" / "validation.md").is_file()
    assert not (tmp_path / "again" / "runs" / "sarathi" / "load_0.5" / "real").exists()  # nothing real re-run
    for m in METRICS:
        assert again.rows[0][f"{m}_err_pct"] == pytest.approx(report.rows[0][f"{m}_err_pct"], rel=1e-12)
    assert again.capacity["sarathi"]["sim_qps"] == report.capacity["sarathi"]["sim_qps"]
    with pytest.raises(InputError, match="another folder"):
        rescore(out, cost, out)


@pytest.mark.parametrize("kwargs, match", [
    ({"policies": ["no-such-policy"]}, "unknown policy"),
    ({"policies": []}, "no policy"),
    ({"loads": [0.0]}, "load"),
    ({"loads": [-0.5]}, "load"),
    ({"loads": [float("nan")]}, "load"),
    ({"loads": []}, "no load"),
    ({"cost": "/nonexistent/cost_model.json"}, "no such file"),
    ({"cost": ""}, "cost"),
    ({"workload": Workload(trace="sharegpt", qps=None, num_requests=20, scale=0)}, "scale"),
    ({"quiet_wait_s": -1}, "quiet"),
    ({"repeats": 0}, "repeats"),
    ({"repeats": 1.5}, "repeats"),
    # closed-loop clients drive a lone engine: a P/D pair replays arrivals open loop
    ({"workload": Workload(trace="sharegpt", qps=None, num_requests=20, scale=0.02, concurrency=4),
      "prefill_instances": 1, "decode_instances": 1}, "closed-loop clients drive a lone engine"),
])
def test_bad_input(cost, tmp_path, kwargs, match):
    args = {"policies": ["sarathi"], "loads": [0.5],
            "workload": Workload(trace="sharegpt", qps=None, num_requests=20, scale=0.02),
            "cost": cost, "out": tmp_path / "val", "model": MODEL, "threads": 1}
    args.update(kwargs)
    with pytest.raises(InputError, match=match):
        validate_main(**args)
    assert not (tmp_path / "val").exists()  # nothing written


def test_slo_that_never_binds_is_an_input_error(cost, tmp_path):
    """6 short requests are all served within 2 s at any rate: no capacity to scale the loads by. Refused as
    too few for a capacity search, before anything runs."""
    with pytest.raises(InputError, match="num-requests"):
        validate_main(["sarathi"], Workload(trace="sharegpt", qps=None, num_requests=6, scale=0.02), [0.5],
                      cost=cost, out=tmp_path / "val", model=MODEL, threads=1)
    assert not (tmp_path / "val").exists()


def test_search_qps_brackets_and_bisects():
    """The same search as simctl.studies.capacity.find_capacity on any probe, with a bracketing factor."""
    def probe(q):
        return {"qps": q, "sustainable": True, "completed": 1, "num_requests": 1, "tbt_p99": 0.0,
                "ttft_p50": 0.0, "sched_delay_p50": 1.0 if q <= 3.3 else 5.0}

    r = search_qps(probe, SLO(), 1.0, rel_tol=0.01, max_probes=30)
    assert 3.3 * 0.99 <= r.qps <= 3.3
    r = search_qps(probe, SLO(), 3.0, rel_tol=0.03, max_probes=6, step=1.25)
    assert len(r.probes) <= 6 and 3.0 <= r.qps <= 3.3
    assert [p["slo_met"] for p in r.probes][:2] == [True, False]  # 3.0 met, 3.75 missed


def test_a_cost_file_that_is_not_a_fitted_model_is_an_input_error(tmp_path):
    bad = tmp_path / "cost_model.json"
    bad.write_text("{}", encoding="utf-8")
    with pytest.raises(InputError, match="not a fitted cost model"):
        validate_main(["sarathi"], Workload(trace="sharegpt", qps=None, num_requests=20, scale=0.02), [0.5],
                      cost=bad, out=tmp_path / "val", model=MODEL, threads=1)
