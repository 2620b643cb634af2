"""Sarathi-Serve's Table 4 variants, step by step on one hand-made trace, as the paper's artifact schedules
them (microsoft/sarathi-serve, osdi-experiments/table-6/scheduling_ablation.sh): the combined system
(Sarathi's scheduler at a small chunk size), hybrid-batching-only (the same scheduler, chunk size = the max
model length) and chunked-prefills-only (SimpleChunkingScheduler: prefill and decode iterations take
turns)."""

from __future__ import annotations

import pytest
from policy_cases import add, make_seqs, run_plan, shape

from simctl.policies.registry import make_policy

# a (4-token prompt, 3 tokens out) runs alone for one iteration; then b (20, 2) and c (6, 2) arrive
TRACE = [(4, 3), (20, 2), (6, 2)]
EXPECTED = {
    # budget 8: a's decode first, then b's chunk of the 7 left; b mid-prompt takes chunks before c is admitted
    # with the 2 left; c's last chunk rides with b's decode
    ("sarathi", 8): [[(0, 4)], [(0, 1), (1, 7)], [(0, 1), (1, 7)], [(1, 6), (2, 2)], [(1, 1), (2, 4)],
                     [(2, 1)]],
    # budget = max model length 24: b's whole prompt beside a's decode, c split where the 24 end (3 of 6)
    ("sarathi-hybrid-only", 24): [[(0, 4)], [(0, 1), (1, 20), (2, 3)], [(0, 1), (1, 1), (2, 3)], [(2, 1)]],
    # budget 32: everything whole in one iteration, then the decodes
    ("sarathi-hybrid-only", 32): [[(0, 4)], [(0, 1), (1, 20), (2, 6)], [(0, 1), (1, 1), (2, 1)]],
    # budget 8: a chunk iteration, then one of the decodes, in turn; c is admitted only once b's prompt is
    # done; with no decode running (a finished, b mid-prompt) b's chunks follow each other
    ("sarathi-chunked-only", 8): [[(0, 4)], [(0, 1)], [(1, 8)], [(0, 1)], [(1, 8)], [(1, 4)], [(1, 1)],
                                  [(2, 6)], [(2, 1)]],
}


@pytest.mark.parametrize(("name", "budget"), EXPECTED)
def test_each_variant_schedules_the_trace_as_its_artifact_does(name: str, budget: int) -> None:
    hybrid = name == "sarathi-hybrid-only"
    policy = make_policy(name, 1 << 16, budget if hybrid else 64, {} if hybrid else {"token_budget": budget})
    a, b, c = make_seqs(TRACE)
    add(policy, a)
    got = []
    while (plan := policy.schedule()) is not None:
        got.append(shape(plan))
        run_plan(policy, plan)
        if len(got) == 1:
            add(policy, b, c)
    assert got == EXPECTED[(name, budget)]


def test_hybrid_only_takes_no_token_budget_of_its_own() -> None:
    """Its budget is the deployment's max model length, as the artifact set --sarathi_scheduler_chunk_size to
    --model_max_model_len (8,192 sharegpt, 16,384 arxiv)."""
    assert make_policy("sarathi-hybrid-only", 1 << 20, 16384, {}).token_budget == 16384
    with pytest.raises(TypeError):
        make_policy("sarathi-hybrid-only", 1 << 20, 16384, {"token_budget": 512})
