"""The machine's speed during a real vLLM run (`simctl.validation.vllm_validate.run_speed`): as simctl's own
validation measures it, the run's busy time over the fit's price of the same steps, counted only where a step
continues a busy engine, its shape read back from the requests vLLM gave a token."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import AffineCost

from simctl.traces.request import Request
from simctl.validation.vllm_validate import run_speed

pytestmark = pytest.mark.unit

# 1 ms a step + 0.1 ms per token it computes: a decode row is 1 token, a whole prompt its length
COST = AffineCost(overhead=1e-3, per_token=1e-4, per_attn=0.0, per_kv=0.0)


def _run(ends_ms: list[float], members: list[list[tuple[int, int]]], prefill: list[int], decode: list[int],
         requests: list[Request]) -> SimpleNamespace:
    frame = pd.DataFrame({"start_s": [e / 1e3 - 5e-4 for e in ends_ms], "duration_s": 5e-4,
                          "prefill_tokens": prefill, "decode_tokens": decode})
    return SimpleNamespace(result=SimpleNamespace(iterations=SimpleNamespace(frame=lambda: frame)),
                           members=members, requests=requests)


def test_busy_time_over_the_price_of_the_steps_that_continue_a_busy_engine() -> None:
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.0, 20, 3), Request(2, 0.011, 30, 2)]
    run = _run([10, 12, 17, 19],
               [[(0, 0), (1, 0)],  # both prompts: follows idle time, not counted
                [(0, 1), (1, 1)],  # two decodes: 2 ms served, priced 1.2 ms
                [(0, 2), (1, 2), (2, 0)],  # two decodes and request 2's prompt: 5 ms, priced 1 + 3.2 ms
                [(2, 1)]],  # one decode: 2 ms, priced 1.1 ms
               prefill=[30, 0, 30, 0], decode=[0, 2, 2, 1], requests=reqs)
    assert run_speed(run, COST) == pytest.approx((2 + 5 + 2) / (1.2 + 4.2 + 1.1))


def test_a_step_whose_shape_does_not_add_up_is_left_out() -> None:
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.0, 20, 3)]
    # step 2 says 25 prefill tokens that no member accounts for (a prefix-cache hit, say): not priced
    run = _run([10, 12, 16], [[(0, 0), (1, 0)], [(0, 1), (1, 1)], [(0, 2), (1, 2)]],
               prefill=[30, 0, 25], decode=[0, 2, 2], requests=reqs)
    assert run_speed(run, COST) == pytest.approx(2 / 1.2)


def test_a_run_with_no_busy_step_has_no_speed() -> None:
    run = _run([10], [[(0, 0)]], prefill=[10], decode=[0], requests=[Request(0, 0.0, 10, 1)])
    assert run_speed(run, COST) is None


def test_runs_at_the_fit_speed_are_compared_with_the_raw_twin(tmp_path) -> None:
    """Four rounds at speed factors 0.97, 1.20 and 1.04 (and a run without one): the rounds within 5% of the
    fit's speed are the first and the third; their medians are compared with the unscaled twin."""
    from simctl.traces.workload import Workload
    from simctl.validation.pipeline import Point
    from simctl.validation.target import ServedRun
    from simctl.validation.vllm_validate import METRICS, VLLMTarget, VLLMValidation, _row, simulate_requests

    settings = {"policy": "vllm-v1", "kv_cache_tokens": 64 * 16, "block_size": 16, "max_batch_size": 8,
                "max_num_batched_tokens": 256,
                "long_prefill_token_threshold": 0, "enable_prefix_caching": 0, "max_model_len": 512}
    v = VLLMValidation(workload=Workload(trace="sharegpt", qps=None, num_requests=12, scale=0.01))
    sim = simulate_requests(v.requests_at(5.0), settings, COST)[0]
    real = [{m: (k + 1) * sim[m] for m in METRICS} for k in range(4)]  # errors: (k + 1) x the twin
    runs = [ServedRun(r, speed) for r, speed in zip(real, [0.97, 1.2, 1.04, None], strict=True)]
    target = VLLMTarget(v, COST, print, resolved=settings)  # not started: the twin is all the row needs
    row = _row(Point("vllm-v1", 0.5, 10.0, v.workload.at(5.0)), runs, target, tmp_path)
    assert row["qps"] == 5.0 and row["runs_at_fit_speed"] == 2
    for m in (m for m in METRICS if sim[m]):  # a delay of 0 has no relative error
        assert row[f"{m}_err_pct_at_fit_speed"] == pytest.approx(100 * (1 / 2 - 1))  # median of 1x and 3x
        assert row[f"{m}_err_pct"] == pytest.approx(100 * (1 / 2.5 - 1))  # median of all four


def test_the_hit_rate_error_is_in_points_of_the_real_rate() -> None:
    from simctl.validation.vllm_validate import _hit_rates

    assert _hit_rates(0.50, 0.52)["prefix_cache_hit_rate_err_pts"] == pytest.approx(2.0)
    assert _hit_rates(None, 0.52)["prefix_cache_hit_rate_err_pts"] is None  # caching off in the real run
