"""Conformance: every registered policy, with its settings drawn from their declared bounds (and choices), is
checked through what it declares, never its name.

What every policy keeps, over hypothesis' random traces:
- every request finishes exactly once with exactly its output tokens; its events are in order;
- KV within capacity throughout, nothing held and nothing queued at the end;
- admission follows the waiting queue's order (`--admission`): what a step admits is the queue's head;
- token accounting: the iterations process the prompts, the outputs but the last one of each request and the
  caches preemptions dropped, less prefix-cache hits;
- `extend` (and the simulator's stretches) give the schedule of stepping one iteration at a time; the same
  inputs give the same results.
What a declaration promises:
- `reserves_kv`: KV for the max sequence length set aside at admission, so nobody is ever preempted;
- `padded_batches`: a batch forms only when none runs and decodes all its rows, finished ones included,
  until its last request ends;
- `shares_prefixes` false: no request starts from KV another one computed.
Each paper's own algorithm is checked in `tests/test_policies.py` and the policy's own test file.
"""

from __future__ import annotations

import copy
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import AffineCost, examples
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from policy_cases import Step, build, cases, drive

from simctl.costs.base import CostModel
from simctl.costs.roofline import Roofline
from simctl.policies.base import Policy
from simctl.policies.kv import ReservedKV
from simctl.policies.registry import POLICIES
from simctl.results.metrics import summarise_result
from simctl.results.run_result import SimResult
from simctl.sim.simulate import simulate
from simctl.traces.request import Request

# ----------------------------------------------------------------------------------------------------------
# step by step: every plan checked as it is made (`policy_cases.drive`)
# ----------------------------------------------------------------------------------------------------------


def check_steps(policy: Policy, steps: list[Step]) -> None:
    """What every policy's steps keep, and what its declarations promise."""
    cls = type(policy)
    batch: list = []
    for st_ in steps:
        admitted = [s for s in st_.waiting_before if s not in st_.waiting_after]
        assert admitted == st_.waiting_before[:len(admitted)], "admitted out of the queue's order"
        if not policy.shares_prefixes:
            assert all(r.computed == 0 for r in st_.rows if r.seq in admitted)
        if cls.reserves_kv:
            assert isinstance(policy.kv, ReservedKV)
            assert st_.kv_used >= policy.kv.reserve_tokens * len(st_.running_after)
            assert st_.kv_used % policy.kv.reserve_tokens == 0
        if cls.padded_batches:
            if admitted:  # a new batch, only once the last one ended
                assert not st_.running_before
                batch = list(st_.running_after)
            if st_.plan.decode_only:  # the whole batch, finished rows computed, nobody joining
                assert st_.plan.seqs == st_.running_before == st_.running_after
                assert st_.plan.decode_rows == len(batch) and st_.waiting_after == st_.waiting_before
    if cls.reserves_kv:
        assert all(s.preemptions == 0 for st_ in steps for s in st_.plan.seqs)


def unrolled(steps: list[Step]) -> list[list[tuple[int, int]]]:
    """The per-iteration schedule, an extended plan unrolled into its repeats."""
    return [[(r.seq.id, r.q) for r in st_.rows] for st_ in steps for _ in range(1 + st_.extra)]


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_steps_conform(name: str, data: st.DataObject) -> None:
    case = data.draw(cases(name, extend=True))
    stepping = copy.deepcopy(case)
    extended = drive(case.policy, case.seqs, case.gaps, case.extend_cap)
    stepped = drive(stepping.policy, stepping.seqs, stepping.gaps)
    check_steps(case.policy, extended)
    check_steps(stepping.policy, stepped)
    # a stretch (extend(), chunk_repeats()) only batches bookkeeping: unrolled, its schedule is stepping's
    assert unrolled(extended) == unrolled(stepped)
    assert [s.preemptions for s in case.seqs] == [s.preemptions for s in stepping.seqs]
    event(f"admission: {case.policy.admission_order}")


# ----------------------------------------------------------------------------------------------------------
# whole simulator runs (`simctl.sim.simulate.simulate`)
# ----------------------------------------------------------------------------------------------------------

COSTS: dict[str, CostModel] = {
    "affine": AffineCost(),
    "tiny": Roofline("tiny", "a100-80gb"),
    "mistral": Roofline("mistral-7b", "a100-80gb"),
}

# arrival gaps: simultaneous, inside one iteration or a few, and idle long enough for the replica to drain
GAPS = st.one_of(
    st.just(0.0),
    st.floats(1e-5, 0.05, allow_nan=False, allow_infinity=False),
    st.floats(0.05, 2.0, allow_nan=False, allow_infinity=False),
    st.floats(20.0, 1000.0, allow_nan=False, allow_infinity=False),
)


@dataclass(frozen=True)
class Scenario:
    requests: tuple[Request, ...]
    cost: str
    policy: Policy  # as built: each run takes a fresh copy


@st.composite
def scenarios(draw: st.DrawFn, name: str) -> Scenario:
    """1..40 requests (prompts 1..600, outputs 1..200, often shared prompt prefixes, a few priorities), a cost
    model, the policy's settings drawn, and a KV capacity often just enough for the longest request."""
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(GAPS, min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 600), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    priorities = draw(st.lists(st.integers(0, 2), min_size=n, max_size=n))
    arrivals = np.cumsum(gaps) - gaps[0] + draw(st.sampled_from([0.0, 0.3]))
    groups = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n)) if draw(st.booleans()) else [-1] * n
    shared = [draw(st.integers(0, p)) if g >= 0 else 0 for g, p in zip(groups, prompts)]
    columns = zip(arrivals, prompts, outputs, priorities, groups, shared)
    requests = tuple(Request(i, float(a), p, o, priority=r, prefix_group=g, prefix_tokens=t)
                     for i, (a, p, o, r, g, t) in enumerate(columns))
    longest = max(p + o for p, o in zip(prompts, outputs))
    max_seq_len = longest + draw(st.sampled_from([0, 0, 1, 37]))
    policy = build(draw, name, longest, max_seq_len,
                   [0, 0, 15, 16, max_seq_len, 3 * max_seq_len, 40 * max_seq_len])
    return Scenario(requests, draw(st.sampled_from(list(COSTS))), policy)


@dataclass
class Observed:
    result: SimResult
    policy: Policy
    finishes: Counter  # request id -> times the policy was told it finished
    dropped: list[int]  # cached tokens each preemption dropped (to be recomputed)
    last_token: dict[int, float]  # request id -> when its last token was sampled


def _run(sc: Scenario, fast: bool) -> Observed:
    policy = copy.deepcopy(sc.policy)
    finishes: Counter = Counter()
    dropped: list[int] = []
    last_token: dict[int, float] = {}
    finish, preempt = policy.finish, policy._preempt

    def counting_finish(seq):
        finishes[seq.id] += 1
        last_token[seq.id] = seq.last_token_s
        finish(seq)

    def recording_preempt(victim):
        dropped.append(victim.computed)
        preempt(victim)

    policy.finish = counting_finish  # instance attributes shadow the methods the policy calls on itself
    policy._preempt = recording_preempt
    result = simulate(list(sc.requests), policy, COSTS[sc.cost], fast=fast)
    return Observed(result, policy, finishes, dropped, last_token)


def _check_run(sc: Scenario, ob: Observed) -> None:
    res, policy = ob.result, ob.policy
    req = res.requests
    assert not res.aborted
    assert list(req["request_id"]) == [r.id for r in sc.requests]

    # every request completes exactly once, with exactly its output tokens, events in order
    assert ob.finishes == Counter({r.id: 1 for r in sc.requests})
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    arrival, sched = req["arrival_s"].to_numpy(), req["first_scheduled_s"].to_numpy()
    first, done = req["first_token_s"].to_numpy(), req["completion_s"].to_numpy()
    # its last token's time: the response may return later (with its batch's)
    last = np.array([ob.last_token[i] for i in req["request_id"]])
    assert (arrival >= 0).all()
    assert (sched >= arrival).all()
    assert (first >= sched).all()
    assert (done >= last).all() and (last >= first).all()
    assert (first > sched).all()  # the first token needs at least one iteration of positive duration
    single = req["output_tokens"].to_numpy() == 1
    assert (last[single] == first[single]).all()
    # a request's largest token gap: none for one token, else between its mean gap and its whole decode time
    longest, outputs = req["max_tbt_s"].to_numpy(), req["output_tokens"].to_numpy()
    assert (longest[single] == 0).all()
    assert (longest <= (last - first) * (1 + 1e-9)).all()
    assert (longest[~single] * (outputs[~single] - 1) >= (last - first)[~single] * (1 - 1e-9)).all()

    # KV within capacity throughout, released at the end, nothing left queued or running
    its = res.iterations.frame()
    assert len(its) > 0
    assert its["kv_used_tokens"].max() <= res.kv_capacity == policy.kv.capacity
    assert policy.kv.used == 0
    assert policy.idle
    assert (its["duration_s"] > 0).all()
    assert (its["count"] >= 1).all()
    assert (its.loc[its["count"] > 1, "prefill_tokens"] == 0).all()  # only decode-only plans repeat

    # iterations never overlap and never start before the first arrival
    start, end = its["start_s"].to_numpy(), (its["start_s"] + its["duration_s"]).to_numpy()
    assert start[0] >= arrival.min()
    assert (start[1:] >= end[:-1] - 1e-9 * np.maximum(1.0, end[:-1])).all()

    # the batch size limit (a policy with concurrent streams also prefills one query apart, beside the batch)
    batch = its["batch_size"].to_numpy()
    assert (batch >= 1).all()
    assert (batch <= policy.max_batch_size + policy.concurrent_streams).all()

    # token accounting: prompts + all outputs but the last + caches dropped by preemption - prefix-cache hits
    processed = int((its["count"] * its["decode_tokens"]).sum() + its["prefill_tokens"].sum())
    expected = int((req["output_tokens"] - 1).sum() + req["prompt_tokens"].sum())
    preemptions = int(req["preemptions"].sum())
    assert preemptions == len(ob.dropped)
    stats = policy.stats()
    hits = stats.get("prefix_cache_hits", 0) + stats.get("prefix_cache_preempted_hits", 0)
    assert processed == expected + sum(ob.dropped) - hits
    if not policy.shares_prefixes:
        assert hits == 0
    if policy.reserves_kv:  # its reservation covers every token it will cache: nobody is preempted
        assert preemptions == 0
        assert (its["kv_used_tokens"] % policy.kv.reserve_tokens == 0).all()
    assert res.iterations.iterations == int(its["count"].sum())

    # the TBT sample holds one gap per token after the first (each request's gaps add up to its decode time)
    gaps = res.gaps
    if hasattr(gaps, "arrays"):  # a weighted sample of raw gaps
        values, weights = gaps.arrays()
        assert int(weights.sum()) == int((req["output_tokens"] - 1).sum())
        assert (values > 0).all()
        total = float((last - first).sum())
        assert float((values * weights).sum()) == pytest.approx(total, rel=1e-9, abs=1e-12)
    else:  # a histogram of them
        assert int(gaps.total) == int(gaps.counts.sum()) == int((req["output_tokens"] - 1).sum())


TIME_COLUMNS = ("first_scheduled_s", "first_token_s", "completion_s", "max_tbt_s")


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=examples(40, 100), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_simulator_runs_conform(name: str, data: st.DataObject) -> None:
    sc = data.draw(scenarios(name), label="scenario")
    fast = _run(sc, fast=True)
    _check_run(sc, fast)
    event(f"preempted: {bool(fast.dropped)}")
    event(f"fast path stretched: {bool((fast.result.iterations.frame()['count'] > 1).any())}")
    event(f"cost: {sc.cost}")

    # the fast path is exact: same per-request times, preemptions and iteration count as stepping
    step = _run(sc, fast=False)
    _check_run(sc, step)
    for col in TIME_COLUMNS:
        np.testing.assert_allclose(fast.result.requests[col], step.result.requests[col], rtol=1e-9, atol=0,
                                   err_msg=col)
    assert (fast.result.requests["preemptions"] == step.result.requests["preemptions"]).all()
    assert fast.dropped == step.dropped
    assert fast.result.iterations.iterations == step.result.iterations.iterations
    assert (step.result.iterations.frame()["count"] == 1).all()

    # deterministic: the same inputs give the same summary (wall time aside)
    again = _run(sc, fast=True)
    a, b = summarise_result(fast.result), summarise_result(again.result)
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert a == b
    assert (a["saturation"] == "overloaded") == (not a["sustainable"])  # the verdict refines sustainability
    for col in TIME_COLUMNS:
        assert (fast.result.requests[col] == again.result.requests[col]).all()
