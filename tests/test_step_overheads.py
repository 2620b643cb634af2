"""Step overheads (costs/overheads.py) in both cost models, each term checked by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simctl.catalogue.gpus import get_gpu
from simctl.common.errors import InputError
from simctl.costs.fitted import Fitted
from simctl.costs.loader import default_cost_path
from simctl.costs.overheads import (
    EAGER_LAUNCH_S_PER_LAYER,
    HOST_S_PER_LAYER,
    HOST_S_PER_REQUEST,
    StepOverheads,
)
from simctl.costs.roofline import Roofline
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq


def _plan(decodes: int, prompt: int = 0):
    ds = [Seq(i, 0.0, 100, 10) for i in range(decodes)]
    for s in ds:
        s.computed = 100
    ps = [Seq(99, 0.0, prompt, 5)] if prompt else []
    return hybrid(ds, ps, [prompt] if prompt else [])


def test_per_request_and_per_sampled_token_costs_add_by_hand() -> None:
    # 8 scheduled requests; 7 decodes and the prompt's last token sample: 8 tokens
    plan = _plan(7, prompt=300)
    base = Roofline("llama-2-7b", "a100-80gb", request_s=0.0)
    both = Roofline("llama-2-7b", "a100-80gb", request_s=1e-4, sampled_token_s=3e-5)
    assert len(plan.seqs) == 8 and plan.sampled_tokens == 8
    assert both.iteration_time(plan) - base.iteration_time(plan) == pytest.approx(
        8 * 1e-4 + 8 * 3e-5, rel=1e-9)
    # the per-step default: 18.1 us for each of the 32 layers
    assert both.breakdown(plan)["overhead"] == pytest.approx(32 * 18.1e-6 + 8e-4 + 2.4e-4, rel=1e-12)


def test_eager_floor_holds_small_steps_and_not_large_ones() -> None:
    eager = Roofline("llama-2-7b", "h100", execution="eager")
    graph = Roofline("llama-2-7b", "h100")
    one = _plan(1)
    assert graph.iteration_time(one) < 0.022  # the GPU's own time of a batch-1 decode
    # the host's 32 x 18.1 us + 0.118 ms for its one request, above the launch floor of 32 layers (22 ms
    # measured on an H100, eager, 7B)
    step = 32 * 18.1e-6 + 0.118e-3 + 32 * EAGER_LAUNCH_S_PER_LAYER
    assert eager.iteration_time(one) == pytest.approx(step, rel=1e-12)
    assert step == pytest.approx(0.0226972, rel=1e-12)
    assert eager.stretch_times(one, 3) == pytest.approx([step] * 3, rel=1e-12)
    big = _plan(0, prompt=4096)
    assert graph.iteration_time(big) > step
    assert eager.iteration_time(big) == graph.iteration_time(big)
    assert sum(eager.breakdown(one).values()) == pytest.approx(step, rel=1e-12)


def test_defaults_and_bad_values() -> None:
    s = StepOverheads.defaults("eager", 80)  # the host's terms are cuda-graph's (the same engine's Python)
    assert (s.iteration_s, s.request_s, s.sampled_token_s) == (80 * HOST_S_PER_LAYER, HOST_S_PER_REQUEST, 0.0)
    assert (s.iteration_s, s.request_s) == pytest.approx((1.448e-3, 0.118e-3), rel=1e-12)
    assert s.launch_floor_s == pytest.approx(80 * 22e-3 / 32)
    assert StepOverheads.defaults("cuda-graph", 80).launch_floor_s == 0.0
    with pytest.raises(InputError, match="execution"):
        StepOverheads.defaults("graphs", 32)
    with pytest.raises(InputError, match="request_s"):
        StepOverheads(request_s=-1.0)
    steps = Roofline("llama-2-7b", "h100").assumptions()["step_overheads"]
    assert (steps["iteration_s"], steps["request_s"]) == (32 * HOST_S_PER_LAYER, HOST_S_PER_REQUEST)
    # the hot paths add step + request x requests only where no other term depends on the batch
    assert StepOverheads(iteration_s=3e-3, request_s=1e-4).per_request_only == (3e-3, 1e-4)
    assert StepOverheads(sampled_token_s=1e-5).per_request_only is None
    assert StepOverheads(new_request_s=1e-4).per_request_only is None
    assert StepOverheads(new_request_token_s=1e-6).per_request_only is None


def test_fitted_model_adds_its_step_overheads_and_keeps_them_in_its_file(tmp_path) -> None:
    data = json.loads(Path(default_cost_path(get_gpu("cpu"))).read_text(encoding="utf-8"))
    base = Fitted.from_json(data)
    data["step_overheads"] = StepOverheads("eager", 1e-3, 2e-4, 5e-5, 0.0, "test").to_json()
    with_steps = Fitted.from_json(data)
    plan = _plan(3, prompt=20)  # 4 requests, 4 sampled tokens
    extra = 1e-3 + 4 * 2e-4 + 4 * 5e-5
    assert with_steps.iteration_time(plan) - base.iteration_time(plan) == pytest.approx(extra, rel=1e-9)
    again = Fitted.from_json(json.loads(json.dumps(with_steps.to_json())))
    assert again.iteration_time(plan) == with_steps.iteration_time(plan)
    assert again.assumptions()["step_overheads"]["request_s"] == 2e-4
