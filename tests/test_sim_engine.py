"""The simulator's engine: the decode-stretch fast path is exact, runs are deterministic, records add up."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import AffineCost, random_requests

from simctl.policies.registry import POLICIES, make_policy
from simctl.results.metrics import summarise_result
from simctl.sim.simulate import simulate


def _run(policy_name: str, requests, fast: bool, kv: int = 60_000):
    policy = make_policy(policy_name, kv, max_seq_len=2400)
    return simulate(requests, policy, AffineCost(), fast=fast)


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("qps", [0.5, 4.0])
def test_fast_path_matches_step_by_step(policy: str, qps: float) -> None:
    requests = random_requests(150, qps, seed=7)
    fast, step = _run(policy, requests, True), _run(policy, requests, False)
    for col in ("first_scheduled_s", "first_token_s", "completion_s"):
        np.testing.assert_allclose(fast.requests[col], step.requests[col], rtol=1e-9, atol=1e-9)
    assert (fast.requests["preemptions"] == step.requests["preemptions"]).all()
    assert fast.iterations.iterations == step.iterations.iterations
    sf, ss = summarise_result(fast), summarise_result(step)
    for key, value in ss.items():
        if key == "sim_wall_s":
            continue
        if isinstance(value, float):
            assert sf[key] == pytest.approx(value, rel=1e-9, abs=1e-12), key
        else:
            assert sf[key] == value, key
    assert len(fast.iterations.count) < len(step.iterations.count)  # the fast path did batch stretches


@pytest.mark.parametrize("policy", list(POLICIES))
def test_every_request_finishes_once_with_its_tokens(policy: str) -> None:
    requests = random_requests(200, 3.0, seed=3)
    res = _run(policy, requests, True, kv=20_000)
    df = res.requests
    assert (df["generated_tokens"] == df["output_tokens"]).all()
    assert (df["completion_s"] >= df["first_token_s"]).all()
    assert (df["first_token_s"] > df["arrival_s"]).all()
    assert max(res.iterations.kv_used) <= res.kv_capacity


def test_same_seed_same_summary() -> None:
    a = summarise_result(_run("vllm", random_requests(100, 2.0, seed=1), True))
    b = summarise_result(_run("vllm", random_requests(100, 2.0, seed=1), True))
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert a == b


@pytest.mark.parametrize("policy", ["orca", "sarathi"])
def test_waits_without_simpy_events_change_nothing(policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A lone replica runs most waits without a SimPy event (nothing else can happen before they end); a
    replica that makes an event for every wait, beside another process with events of its own, gets the
    very same results."""
    import simpy

    import simctl.sim.cluster

    requests = random_requests(150, 2.0, seed=3)
    lone = _run(policy, requests, True)

    def ticker(env: simpy.Environment):  # an unrelated process with an event every 10 ms of simulated time
        while env.now < 200:  # past the run's end (150 requests at 2 QPS)
            yield env.timeout(0.01)

    real_drive = simctl.sim.cluster.drive
    monkeypatch.setattr(simctl.sim.cluster, "YIELD_EVERY", 0)
    monkeypatch.setattr(simctl.sim.cluster, "drive",
                        lambda env, member, cluster: (env.process(ticker(env)),
                                                      real_drive(env, member, cluster))[1])
    busy = _run(policy, requests, True)
    for col in lone.requests.columns:
        assert (lone.requests[col].to_numpy() == busy.requests[col].to_numpy()).all(), col
    assert lone.iterations.frame().equals(busy.iterations.frame())
