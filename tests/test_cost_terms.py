"""Each cost model's formula is written once (`_terms`): the price of a plan, its per-term breakdown and the
price of a decode stretch all come from it, so they agree on every plan."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.catalogue.gpus import get_gpu
from simctl.costs.fitted import Fitted
from simctl.costs.loader import default_cost_path
from simctl.costs.roofline import Roofline
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq

MODELS = {
    "roofline": Roofline("mistral-7b", "a100-80gb"),
    "roofline-tp2": Roofline("llama-2-70b", "a100-80gb", tp=4),
    "fitted": Fitted.load(default_cost_path(get_gpu("cpu"))),
}


@st.composite
def plans(draw):
    decodes = [Seq(i, 0.0, 1, 10) for i in range(draw(st.integers(0, 40)))]
    for s in decodes:
        s.computed = draw(st.integers(1, 3000))
    prefills, chunks = [], []
    for j in range(draw(st.integers(0 if decodes else 1, 4))):
        s = Seq(100 + j, 0.0, draw(st.integers(1, 4000)), 5)
        s.computed = draw(st.integers(0, s.prompt_tokens - 1))
        prefills.append(s)
        chunks.append(draw(st.integers(1, s.prompt_tokens - s.computed)))
    return hybrid(decodes, prefills, chunks)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(MODELS)), plan=plans())
def test_breakdown_sums_to_the_price_and_stretches_start_at_it(name: str, plan) -> None:
    cost = MODELS[name]
    price = cost.iteration_time(plan)
    assert sum(cost.breakdown(plan).values()) == pytest.approx(price, rel=1e-12)
    if plan.decode_only:
        assert cost.stretch_times(plan, 3)[0] == pytest.approx(price, rel=1e-12)
