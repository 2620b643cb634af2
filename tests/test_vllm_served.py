"""The served-mode calibration of a vLLM profile (`profiler/vllm_served.py`): served steps' periods, and the
host terms fitted from what the profiled model misses, by hand."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.costs.fitted import Fitted
from simctl.policies.plan import BatchPlan
from simctl.profiler.vllm_served import ServedStep, calibrate, decode_periods, decode_plan, served_overheads

SHIPPED = Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu" / "cost_model.json"


class PerRow(CostModel):
    """1 ms per scheduled request."""

    def iteration_time(self, plan: BatchPlan) -> float:
        return 1e-3 * len(plan.seqs)


def test_a_period_is_a_decode_step_after_a_decode_step() -> None:
    # steps end at 0, 1, 3, 6, 10 s; the 2nd to 4th decode the whole batch: periods 3 - 1 and 6 - 3
    periods = decode_periods(np.array([0.0, 1, 3, 6, 10]), np.array([False, True, True, True, False]))
    assert periods.tolist() == [2.0, 3.0]


def test_a_decode_plan_has_the_batch_at_its_context() -> None:
    plan = decode_plan(3, 200)
    assert plan.decode_only and plan.decode_rows == 3 and plan.sampled_tokens == 3
    assert [s.computed for s in plan.seqs] == [200] * 3


def test_the_residual_splits_into_a_per_step_and_a_per_request_term() -> None:
    """Served = 1 ms/request (the model) + 0.5 ms/step + 20 us/request: the fit finds 0.5 ms and 20 us."""
    steps = [ServedStep(b, 100, 1e-3 * b + 0.5e-3 + 20e-6 * b, 1e-3 * b, 30) for b in (1, 4, 16)]
    o = served_overheads(PerRow(), steps)
    assert o.iteration_s == pytest.approx(0.5e-3, rel=1e-9)
    assert o.request_s == pytest.approx(20e-6, rel=1e-9)
    assert o.sampled_token_s == 0 and o.launch_floor_s == 0 and "1, 4, 16" in o.source


def test_a_served_step_faster_than_the_profile_adds_nothing() -> None:
    steps = [ServedStep(b, 100, 0.9e-3 * b, 0.9e-3 * b, 30) for b in (1, 8)]
    o = served_overheads(PerRow(), steps)
    assert o.iteration_s == 0 and o.request_s == 0


def test_calibrate_adds_the_host_terms_to_a_fit() -> None:
    """A fit priced at p(B) and served steps at p(B) + 1 ms + 10 us x B: the calibrated fit prices every step
    1 ms + 10 us/request more, and reports each served step beside both prices."""
    fitted = Fitted.load(SHIPPED)
    price = fitted.iteration_time
    steps = [{"batch": b, "context": 120, "time_s": price(decode_plan(b, 120)) + 1e-3 + 1e-5 * b,
              "model_s": 0.0, "steps": 10} for b in (1, 8, 32)]
    calibrated, rows = calibrate(fitted, {"served_steps": steps})
    assert calibrated.step_overheads.iteration_s == pytest.approx(1e-3, rel=1e-6)
    assert calibrated.step_overheads.request_s == pytest.approx(1e-5, rel=1e-6)
    plan = decode_plan(5, 300)
    assert calibrated.iteration_time(plan) == pytest.approx(price(plan) + 1e-3 + 5e-5, rel=1e-9)
    assert [r["batch"] for r in rows] == [1, 8, 32]
    assert all(r["calibrated_ms"] == pytest.approx(r["served_ms"], rel=1e-6) for r in rows)
    assert calibrate(fitted, {})[0] is fitted  # a profile without served steps: unchanged


def test_the_fit_calibrates_by_the_profiles_engine() -> None:
    """`profiler.fit.calibrate` hands a vLLM profile (meta.json's engine) to vLLM's calibration and leaves
    another engine's profile as fitted, served steps or not."""
    from simctl.profiler import fit

    fitted = Fitted.load(SHIPPED)
    steps = [{"batch": b, "context": 120, "time_s": fitted.iteration_time(decode_plan(b, 120)) + 1e-3,
              "model_s": 0.0, "steps": 10} for b in (1, 8)]
    by_vllm, rows = fit.calibrate(fitted, {"engine": "vllm", "served_steps": steps})
    assert by_vllm.step_overheads.iteration_s == pytest.approx(1e-3, rel=1e-6) and len(rows) == 2
    for engine in (None, "simctl", ["vllm"]):
        assert fit.calibrate(fitted, {"engine": engine, "served_steps": steps}) == (fitted, [])


@pytest.mark.parametrize("entry", [{"batch": 0, "context": 10, "time_s": 1.0, "model_s": 0.0, "steps": 1},
                                   {"batch": 1, "context": 10, "time_s": -1.0, "model_s": 0.0, "steps": 1},
                                   {"batch": 1, "time_s": 1.0}, "x"])
def test_a_malformed_served_step_is_an_input_error(entry: object) -> None:
    with pytest.raises(InputError, match="served_steps"):
        calibrate(Fitted.load(SHIPPED), {"served_steps": [entry]})


def test_calibrate_takes_the_median_admission_latency_and_keeps_it_in_the_file(tmp_path) -> None:
    """Latencies of 1, 2 and 9 ms: the fit's admission latency is their median, 2 ms; it survives the
    cost_model.json round trip, says itself in the host terms' line, and changes no step's price."""
    fitted = Fitted.load(SHIPPED)
    steps = [{"batch": b, "context": 120, "time_s": fitted.iteration_time(decode_plan(b, 120)) + 1e-3,
              "model_s": 0.0, "steps": 10} for b in (1, 8)]
    calibrated, _ = calibrate(fitted, {"served_steps": steps, "served_admission_s": [9e-3, 1e-3, 2e-3]})
    assert calibrated.admission_s == pytest.approx(2e-3, rel=1e-12)
    assert "admission 2 ms" in calibrated.step_overheads.describe()
    plan = decode_plan(4, 200)
    assert calibrated.iteration_time(plan) == pytest.approx(fitted.iteration_time(plan) + 1e-3, rel=1e-9)
    (tmp_path / "c.json").write_text(json.dumps(calibrated.to_json()))
    assert Fitted.load(tmp_path / "c.json").admission_s == pytest.approx(2e-3, rel=1e-12)
    without, _ = calibrate(fitted, {"served_steps": steps})  # an older profile: no latency measured
    assert without.admission_s == 0 and "admission_s" not in without.step_overheads.to_json()


@pytest.mark.parametrize("raw", ["x", [1e-3, -1e-3], [2.0], [None]])
def test_a_malformed_admission_latency_is_an_input_error(raw: object) -> None:
    steps = [{"batch": 1, "context": 10, "time_s": 1.0, "model_s": 0.0, "steps": 1}]
    with pytest.raises(InputError, match="served_admission_s"):
        calibrate(Fitted.load(SHIPPED), {"served_steps": steps, "served_admission_s": raw})
