"""Prepacking (Zhao et al., 2024) and its baselines: First-Fit Decreasing, bin-packed plans, and their price
against full batching (Section 3.3: never slower, equal when no two prompts share a row)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.catalogue.gpus import get_gpu
from simctl.costs.features import plan_features
from simctl.costs.fitted import Fitted
from simctl.costs.loader import default_cost_path
from simctl.costs.roofline import Roofline
from simctl.policies.binpack import first_fit_decreasing
from simctl.policies.plan import Layout, binpacked_prefill, padded_prefill
from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq

MODELS = {
    "roofline": Roofline("mistral-7b", "a100-80gb"),
    "roofline-a6000": Roofline("llama-2-7b", "a6000"),
    "fitted-cpu": Fitted.load(default_cost_path(get_gpu("cpu"))),
}


def test_ffd_hand_cases() -> None:
    # longest first, each into the first row with room
    assert first_fit_decreasing([5, 4, 3, 2, 1], 5) == [[0], [1, 4], [2, 3]]
    assert first_fit_decreasing([2, 7, 3, 5], 7) == [[1], [3, 0], [2]]
    assert first_fit_decreasing([4, 4, 4], 4) == [[0], [1], [2]]  # nothing shares: one row per prompt
    assert first_fit_decreasing([1] * 6, 3) == [[0, 1, 2], [3, 4, 5]]
    with pytest.raises(ValueError):
        first_fit_decreasing([3, 9], 8)


@settings(max_examples=300, deadline=None)
@given(lengths=st.lists(st.integers(1, 600), min_size=1, max_size=64))
def test_ffd_rows_hold_every_prompt_once_and_no_two_rows_could_merge(lengths: list[int]) -> None:
    cap = max(lengths)
    bins = first_fit_decreasing(lengths, cap)
    assert sorted(i for b in bins for i in b) == list(range(len(lengths)))
    sums = [sum(lengths[i] for i in b) for b in bins]
    assert max(sums) <= cap
    # First Fit: an item went to a later row only because it did not fit an earlier one, so any two rows
    # together exceed the capacity (hence fewer than 2 x OPT rows)
    assert all(sums[i] + sums[j] > cap for i in range(len(bins)) for j in range(i + 1, len(bins)))
    assert len(bins) >= -(-sum(lengths) // cap)


def _batch(lengths: list[int]) -> list[Seq]:
    return [Seq(i, 0.0, n, 4) for i, n in enumerate(lengths)]


def test_binpacked_plan_shape() -> None:
    seqs = _batch([70, 48, 22, 37, 5, 1])
    bins = first_fit_decreasing([s.prompt_tokens for s in seqs], 70)
    plan = binpacked_prefill(seqs, bins)
    assert bins == [[0], [1, 2], [3, 4, 5]]
    assert plan.layout is Layout.BINPACKED and plan.bins == bins and plan.row_len == 70
    assert plan.linear_tokens == 3 * 70 and plan.sampled_tokens == 6 and plan.prefill_tokens == 183
    assert plan.prefill_q == [70] * 3 and plan.prefill_c == [0] * 3 and plan.dense_attention
    assert plan_features(plan)["attn_units"] == 3 * 70 * 70  # dense L x L per row
    with pytest.raises(ValueError):
        binpacked_prefill(seqs, [[0], [1, 2, 3]])  # a prompt missing, a row over 70


def test_varlen_plan_prices_each_prompt_causally() -> None:
    seqs = _batch([70, 48, 22, 37, 5, 1])
    plan = binpacked_prefill(seqs, first_fit_decreasing([s.prompt_tokens for s in seqs], 70), varlen=True)
    assert plan.linear_tokens == 3 * 70 and not plan.dense_attention  # the rows' pads still go through
    assert plan.prefill_q == [70, 48, 22, 37, 5, 1] and plan.prefill_c == [0] * 6
    assert plan_features(plan)["attn_units"] == sum(q * q / 2 for q in plan.prefill_q)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.integers(1, 2000), min_size=1, max_size=64), name=st.sampled_from(sorted(MODELS)))
def test_prepacking_never_costs_more_than_full_batching(lengths: list[int], name: str) -> None:
    cost = MODELS[name]
    seqs = _batch(lengths)
    bins = first_fit_decreasing(lengths, max(lengths))
    packed = binpacked_prefill(seqs, bins)
    full = padded_prefill(seqs, dense=True)
    assert cost.iteration_time(packed) <= cost.iteration_time(full)
    if len(packed.bins) == len(seqs):  # no two prompts share a row: the same work
        assert cost.iteration_time(packed) == cost.iteration_time(full)
    # varlen: the same rows through the linear layers and no more attention work (its price may still be
    # higher: a fitted model charges per attention segment, and varlen has one per prompt, not per row)
    varlen = plan_features(binpacked_prefill(seqs, bins, varlen=True))
    assert varlen["linear_tokens"] == packed.linear_tokens
    assert varlen["attn_units"] <= plan_features(packed)["attn_units"]


def test_no_shared_row_prices_as_full_batching_and_packing_saves() -> None:
    cost = MODELS["roofline"]
    apart = _batch([900, 800, 700, 600])  # every pair exceeds 900: one row each
    assert cost.iteration_time(binpacked_prefill(apart, first_fit_decreasing([900, 800, 700, 600], 900))) == \
        cost.iteration_time(padded_prefill(apart, dense=True))
    mixed = _batch([2000] + [100] * 31)  # 31 short prompts fill two rows: 3 rows instead of 32
    bins = first_fit_decreasing([s.prompt_tokens for s in mixed], 2000)
    assert len(bins) == 3
    speedup = cost.iteration_time(padded_prefill(mixed, dense=True)) / cost.iteration_time(
        binpacked_prefill(mixed, bins))
    assert speedup > 5  # 32 x 2000 tokens vs 3 x 2000: compute-bound prefill, about n/k


def test_length_ordered_takes_the_shortest_waiting_prompts() -> None:
    policy = make_policy("length-ordered", 100_000, 1000, {"max_batch_size": 2})
    for i, n in enumerate([50, 10, 30, 20]):
        policy.add(Seq(i, 0.001 * i, n, 1))
    plan = policy.schedule()
    assert [s.id for s in plan.seqs] == [1, 3] and plan.row_len == 20 and plan.dense_attention
    assert [s.id for s in policy.waiting] == [2, 0]  # the rest, listed in its admission order
