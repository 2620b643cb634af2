"""Regressions of whole simulator runs at the edges of the decode-stretch fast path (the invariants every run
keeps, for every policy, are in `tests/test_conformance.py`)."""

from __future__ import annotations

import pytest
from conftest import AffineCost

from simctl.policies.registry import make_policy
from simctl.sim.simulate import simulate
from simctl.traces.request import Request


def test_stretch_end_is_the_replica_clock() -> None:
    # one KV slot (capacity = max_seq_len = 50): B waits for A's batch, a 48-iteration decode stretch, to end
    reqs = [Request(0, 0.1, 1, 49), Request(1, 0.1, 1, 1)]
    res = simulate(reqs, make_policy("faster-transformer", 50, 50), AffineCost(), fast=True).requests
    a_done, b_start = res["completion_s"][0], res["first_scheduled_s"][1]
    # regression: the fast path once gave B 0.351124005 and A 0.3511240050000001 (clock = start + sum)
    assert b_start >= a_done


def test_arrival_on_an_iteration_boundary_is_seen_alike_by_both_paths() -> None:
    # A decodes alone for 59 iterations; B arrives exactly when one of them ends (the stepping clock's value)
    policy = make_policy("vllm", 4096, 128)
    alone = simulate([Request(0, 0.0, 1, 60)], policy, AffineCost(), fast=False).iterations.frame()
    late = []
    for t in alone["start_s"].iloc[1:]:
        reqs = [Request(0, 0.0, 1, 60), Request(1, float(t), 1, 2)]
        fast = simulate(reqs, make_policy("vllm", 4096, 128), AffineCost(), fast=True).requests
        step = simulate(reqs, make_policy("vllm", 4096, 128), AffineCost(), fast=False).requests
        assert step["first_scheduled_s"][1] == t  # stepping admits B at once
        if fast["first_scheduled_s"][1] != pytest.approx(step["first_scheduled_s"][1], rel=1e-9):
            late.append((float(t), float(fast["first_scheduled_s"][1])))
    # regression: B arriving at 0.2923520050000001 was once first scheduled one decode iteration late
    assert late == []
