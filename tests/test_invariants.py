"""Invariants of whole simulator runs (`sim.simulate.simulate`), over random traces for every policy.

Hypothesis draws small traces (1..40 requests, prompts 1..600, outputs 1..200, arrival gaps of zero, short
and long idle, often with shared prompt prefixes for prefix caching), a cost model (`AffineCost` or the roofline of the tiny or Mistral-7B shape on an A100), a KV
capacity (often just enough for the longest request, so the paged policies preempt) and sometimes a small
max batch size or token budget, then checks what every run must keep:

- every request completes exactly once (the policy is told `finish` once per request) with exactly its output
  tokens, and 0 <= arrival <= first scheduled <= first token <= completion;
- KV use never exceeds capacity, and at the end the KV manager holds nothing and the policy is idle;
- per-iteration limits read off the iteration log (max batch size, Sarathi's token budget, vLLM's and the
  chunked-only ablation's all-prefill-or-all-decode iterations, FasterTransformer's one batch at a time);
- token accounting: the tokens the iterations processed are exactly the prompts, the outputs but the last
  one of each request, and the caches dropped by preemptions (recorded by wrapping `_preempt`), less the
  prefix-cache hits (vllm-v1);
- the decode-stretch fast path gives the same per-request times as stepping one iteration at a time, and the
  same inputs give the same summary.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import AffineCost
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from policies.base import Policy
from policies.registry import POLICIES, make_policy, max_admissible_tokens
from policies.sarathi import SarathiServe
from sim.cost.base import CostModel
from sim.cost.roofline import Roofline
from sim.metrics import summarize
from sim.simulate import SimResult, simulate
from traces.request import Request

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
    capacity: int
    max_seq_len: int
    max_batch_size: int | None
    token_budget: int | None

    def policy(self, name: str) -> Policy:
        return make_policy(name, self.capacity, self.max_seq_len,
                           {"max_batch_size": self.max_batch_size, "token_budget": self.token_budget})


def _smallest_capacity(name: str, longest: int, max_seq_len: int) -> int:
    """The least KV capacity on which `name` can run a request of `longest` tokens."""
    cap = max(longest, max_seq_len)
    while max_admissible_tokens(name, cap, max_seq_len) < longest:
        cap += 1
    return cap


@st.composite
def scenarios(draw: st.DrawFn, name: str) -> Scenario:
    n = draw(st.integers(1, 40))
    gaps = draw(st.lists(GAPS, min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 600), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 200), min_size=n, max_size=n))
    arrivals = np.cumsum(gaps) - gaps[0] + draw(st.sampled_from([0.0, 0.3]))
    # shared prefixes (prefix caching): a few groups, each request's prefix anywhere within its prompt
    groups = draw(st.lists(st.integers(-1, 2), min_size=n, max_size=n)) if draw(st.booleans()) else [-1] * n
    shared = [draw(st.integers(0, p)) if g >= 0 else 0 for g, p in zip(groups, prompts)]
    requests = tuple(Request(i, float(a), p, o, prefix_group=g, prefix_tokens=t)
                     for i, (a, p, o, g, t) in enumerate(zip(arrivals, prompts, outputs, groups, shared)))
    longest = max(p + o for p, o in zip(prompts, outputs))
    max_seq_len = longest + draw(st.sampled_from([0, 0, 1, 37]))
    least = _smallest_capacity(name, longest, max_seq_len)
    # just enough for one request (preemptions galore for the paged policies), a few, or plenty
    capacity = least + draw(st.sampled_from([0, 0, 15, 16, max_seq_len, 3 * max_seq_len, 40 * max_seq_len]))
    max_batch_size = draw(st.one_of(st.none(), st.integers(1, 6)))
    token_budget = None
    if issubclass(POLICIES[name], SarathiServe):
        token_budget = draw(st.one_of(st.none(), st.integers(1, 8), st.integers(9, 300)))
    cost = draw(st.sampled_from(list(COSTS)))
    return Scenario(requests, cost, capacity, max_seq_len, max_batch_size, token_budget)


@dataclass
class Observed:
    result: SimResult
    policy: Policy
    finishes: Counter  # request id -> times the policy was told it finished
    dropped: list[int]  # cached tokens each preemption dropped (to be recomputed)


def _run(name: str, sc: Scenario, fast: bool) -> Observed:
    policy = sc.policy(name)
    finishes: Counter = Counter()
    dropped: list[int] = []
    finish, preempt = policy.finish, policy._preempt

    def counting_finish(seq):
        finishes[seq.id] += 1
        finish(seq)

    def recording_preempt(victim):
        dropped.append(victim.computed)
        preempt(victim)

    policy.finish = counting_finish  # instance attributes shadow the methods the policy calls on itself
    policy._preempt = recording_preempt
    result = simulate(list(sc.requests), policy, COSTS[sc.cost], fast=fast)
    return Observed(result, policy, finishes, dropped)


def _check_run(name: str, sc: Scenario, ob: Observed) -> None:
    res, policy = ob.result, ob.policy
    req = res.requests
    assert not res.aborted
    assert list(req["request_id"]) == [r.id for r in sc.requests]

    # every request completes exactly once, with exactly its output tokens, events in order
    assert ob.finishes == Counter({r.id: 1 for r in sc.requests})
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    arrival, sched = req["arrival_s"].to_numpy(), req["first_scheduled_s"].to_numpy()
    first, done = req["first_token_s"].to_numpy(), req["completion_s"].to_numpy()
    assert (arrival >= 0).all()
    assert (sched >= arrival).all()
    assert (first >= sched).all()
    assert (done >= first).all()
    assert (first > sched).all()  # the first token needs at least one iteration of positive duration
    single = req["output_tokens"].to_numpy() == 1
    assert (done[single] == first[single]).all()
    # a request's largest token gap: none for one token, else between its mean gap and its whole decode time
    longest, outputs = req["max_tbt_s"].to_numpy(), req["output_tokens"].to_numpy()
    assert (longest[single] == 0).all()
    assert (longest <= (done - first) * (1 + 1e-9)).all()
    assert (longest[~single] * (outputs[~single] - 1) >= (done - first)[~single] * (1 - 1e-9)).all()

    # KV within capacity throughout, released at the end, nothing left queued or running
    its = res.iterations.frame()
    assert len(its) > 0
    assert its["kv_used_tokens"].max() <= res.kv_capacity <= sc.capacity
    assert policy.kv.used == 0
    assert policy.idle
    assert (its["duration_s"] > 0).all()
    assert (its["count"] >= 1).all()
    assert (its.loc[its["count"] > 1, "prefill_tokens"] == 0).all()  # only decode-only plans repeat

    # iterations never overlap and never start before the first arrival
    start, end = its["start_s"].to_numpy(), (its["start_s"] + its["duration_s"]).to_numpy()
    assert start[0] >= arrival.min()
    assert (start[1:] >= end[:-1] - 1e-9 * np.maximum(1.0, end[:-1])).all()

    # per-iteration limits
    batch = its["batch_size"].to_numpy()
    prefill, decode = its["prefill_tokens"].to_numpy(), its["decode_tokens"].to_numpy()
    assert (batch >= 1).all()
    assert (batch <= policy.max_batch_size).all()
    if name == "sarathi":
        budget = policy.token_budget
        under = decode < budget
        assert (prefill[under] + decode[under] <= budget).all()
        assert (prefill[~under] == 0).all()  # a full budget of decodes admits no prefill
    if name in ("sarathi-chunked-only", "vllm"):
        assert not ((prefill > 0) & (decode > 0)).any()
    if name == "vllm":  # the token limit: several prompts together never pass max_seq_len
        assert ((prefill <= sc.max_seq_len) | (batch == 1)).all()
    if name == "faster-transformer":
        # batches = requests sharing a first-scheduled time; a batch lives until its last request completes
        starts = np.unique(sched)
        for t in starts:
            members = sched == t
            inside = (sched > t) & (sched < done[members].max())
            assert not inside.any(), f"requests {np.flatnonzero(inside)} admitted into the batch started at {t}"
        assert (req.groupby("first_scheduled_s").size() <= policy.max_batch_size).all()

    # token accounting: prompts + all outputs but the last + caches dropped by preemption - prefix-cache hits
    processed = int((its["count"] * its["decode_tokens"]).sum() + its["prefill_tokens"].sum())
    expected = int((req["output_tokens"] - 1).sum() + req["prompt_tokens"].sum())
    preemptions = int(req["preemptions"].sum())
    assert preemptions == len(ob.dropped)
    stats = policy.stats()
    hits = stats.get("prefix_cache_hit_tokens", 0) + stats.get("prefix_cache_preempted_hit_tokens", 0)
    assert processed == expected + sum(ob.dropped) - hits
    if name != "vllm-v1":
        assert hits == 0
    if name in ("faster-transformer", "orca"):  # reserving policies never preempt
        assert preemptions == 0
    assert res.iterations.iterations == int(its["count"].sum())

    # the TBT sample holds one gap per token after the first (each request's gaps add up to its decode time)
    gaps = res.gaps
    if hasattr(gaps, "arrays"):  # a weighted sample of raw gaps
        values, weights = gaps.arrays()
        assert int(weights.sum()) == int((req["output_tokens"] - 1).sum())
        assert (values > 0).all()
        assert float((values * weights).sum()) == pytest.approx(float((done - first).sum()), rel=1e-9, abs=1e-12)
    else:  # a histogram of them
        assert int(gaps.total) == int(gaps.counts.sum()) == int((req["output_tokens"] - 1).sum())


TIME_COLUMNS = ("first_scheduled_s", "first_token_s", "completion_s", "max_tbt_s")


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_simulator_invariants(name: str, data: st.DataObject) -> None:
    sc = data.draw(scenarios(name), label="scenario")
    fast = _run(name, sc, fast=True)
    _check_run(name, sc, fast)
    event(f"preempted: {bool(fast.dropped)}")
    event(f"fast path stretched: {bool((fast.result.iterations.frame()['count'] > 1).any())}")
    event(f"cost: {sc.cost}")

    # the fast path is exact: same per-request times, preemptions and iteration count as stepping
    step = _run(name, sc, fast=False)
    _check_run(name, sc, step)
    for col in TIME_COLUMNS:
        np.testing.assert_allclose(fast.result.requests[col], step.result.requests[col], rtol=1e-9, atol=0,
                                   err_msg=col)
    assert (fast.result.requests["preemptions"] == step.result.requests["preemptions"]).all()
    assert fast.dropped == step.dropped
    assert fast.result.iterations.iterations == step.result.iterations.iterations
    assert (step.result.iterations.frame()["count"] == 1).all()

    # deterministic: the same inputs give the same summary (wall time aside)
    again = _run(name, sc, fast=True)
    a, b = summarize(fast.result), summarize(again.result)
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert a == b
    assert (a["saturation"] == "overloaded") == (not a["sustainable"])  # the verdict refines sustainability
    for col in TIME_COLUMNS:
        assert (fast.result.requests[col] == again.result.requests[col]).all()


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
