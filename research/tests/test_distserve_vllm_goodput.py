"""The research script's cost wrappers: what each prices differently from the roofline, and only that."""

from __future__ import annotations

import pytest
from research_scripts import research_module

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.roofline import Roofline
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq

goodput = research_module("distserve_vllm_goodput")


def plans() -> tuple:
    decoding = Seq(0, 0.0, 100, 10)
    decoding.computed = 100
    return hybrid([], [Seq(1, 0.0, 512, 1)], [512]), hybrid([decoding], [], [])


def test_prefill_scaled_prices_prefill_steps_only() -> None:
    roofline = Roofline(get_model("llama-2-13b"), get_gpu("a100-80gb"), execution="eager")
    prefill, decode = plans()
    scaled = goodput.PrefillScaled(roofline, 1.5)
    assert scaled.iteration_time(prefill) == pytest.approx(1.5 * roofline.iteration_time(prefill))
    assert scaled.iteration_time(decode) == roofline.iteration_time(decode)
    assert scaled.stretch_times(decode, 3) == pytest.approx(roofline.stretch_times(decode, 3))


def test_measured_linears_replaces_the_linear_term() -> None:
    roofline = Roofline(get_model("llama-2-13b"), get_gpu("a100-80gb"), execution="eager")
    prefill, decode = plans()
    layer = [0.0, 1e-3, 2e-3]  # seconds per layer at 0, 512 and 1024 tokens
    measured = goodput.MeasuredLinears(roofline, [0, 512, 1024], layer)
    priced = roofline.iteration_time(prefill) - roofline.breakdown(prefill)["linear"] + 40 * 1e-3  # 40 layers
    assert measured.iteration_time(prefill) == pytest.approx(priced)
    assert measured.iteration_time(decode) == roofline.iteration_time(decode)
