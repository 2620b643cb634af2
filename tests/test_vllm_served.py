"""The served-mode calibration of a vLLM profile (`profiler/vllm_served.py`): served steps' periods, and the
host terms fitted from what the profiled model misses, by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from common.errors import InputError
from costs.base import CostModel
from costs.fitted import Fitted
from policies.plan import BatchPlan, packed
from policies.seq import Seq
from profiler.vllm_served import ServedStep, calibrate, decode_periods, decode_plan, served_overheads
from profiler.vllm_stream import admitted_overhead, simulated_makespan, with_admitted

SHIPPED = Path(__file__).resolve().parents[1] / "profiler" / "profiles" / "cpu" / "cost_model.json"


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


@pytest.mark.parametrize("entry", [{"batch": 0, "context": 10, "time_s": 1.0, "model_s": 0.0, "steps": 1},
                                   {"batch": 1, "context": 10, "time_s": -1.0, "model_s": 0.0, "steps": 1},
                                   {"batch": 1, "time_s": 1.0}, "x"])
def test_a_malformed_served_step_is_an_input_error(entry: object) -> None:
    with pytest.raises(InputError, match="served_steps"):
        calibrate(Fitted.load(SHIPPED), {"served_steps": [entry]})


# vLLM's CPU defaults, as the served engine resolves them (what `time_stream` records)
ENGINE = {"policy": "vllm-v1", "kv_cache_tokens": 2048 * 128, "max_model_len": 2048, "block_size": 128,
          "max_num_batched_tokens": 2048, "max_batch_size": 128, "enable_prefix_caching": 1,
          "long_prefill_token_threshold": 0}


def _stream(makespan_s: float) -> dict[str, object]:
    arrivals = [i * 2e-3 for i in range(60)]  # faster than the steps serve them: the engine never idles
    return {"arrivals_s": arrivals, "prompt": 192, "outputs": 40, "makespan_s": makespan_s, "engine": ENGINE}


def test_the_stream_residual_is_a_cost_per_admitted_request() -> None:
    """A stream served 0.8 ms per request slower than its steps: the twin, charged that per admitted
    request, prices its makespan; a stream served faster than priced adds nothing."""
    fitted = Fitted.load(SHIPPED)
    steps = [{"batch": b, "context": 211, "time_s": fitted.iteration_time(decode_plan(b, 211)),
              "model_s": 0.0, "steps": 10} for b in (1, 16)]
    calibrated, _ = calibrate(fitted, {"served_steps": steps})
    served = simulated_makespan(with_admitted(calibrated, 0.8e-3), _stream(0.0))
    admitted, base = admitted_overhead(calibrated, _stream(served))
    assert served > base and admitted == pytest.approx(0.8e-3, rel=0.02)
    again, _ = calibrate(fitted, {"served_steps": steps, "served_stream": _stream(served)})
    assert again.step_overheads.admitted_s == pytest.approx(admitted, rel=1e-9)
    assert admitted_overhead(calibrated, _stream(0.5 * base))[0] == 0


def test_an_admitted_request_is_charged_once() -> None:
    """The term is paid by the step that first schedules a request, not by its later chunks or decodes."""
    fitted = with_admitted(calibrate(Fitted.load(SHIPPED), {"served_steps": [
        {"batch": 1, "context": 100, "time_s": 1e-3, "model_s": 0.0, "steps": 1}]})[0], 1e-3)
    new = Seq(0, 0.0, 64, 4)
    old = Seq(1, 0.0, 64, 4)
    old.first_scheduled_s = 0.0
    assert fitted.iteration_time(packed([new], [64])) - fitted.iteration_time(packed([old], [64])) == (
        pytest.approx(1e-3, rel=1e-9))
    assert fitted.stretch_times(packed([new], [16]), 3)[1:].tolist() == (
        fitted.stretch_times(packed([old], [16]), 3)[1:].tolist())


def test_a_malformed_stream_is_an_input_error() -> None:
    with pytest.raises(InputError, match="served_stream"):
        admitted_overhead(Fitted.load(SHIPPED), {"arrivals_s": []})
