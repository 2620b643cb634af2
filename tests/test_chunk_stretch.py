"""Chunk stretches: a long prompt's full-budget chunks repeated beside an unchanged decode set
(Sarathi-Serve's mixed iterations) run as one stretch: `SarathiServe.chunk_repeats` says how many, the cost
model prices the repeats at once, `PagedKV.used_while_growing` gives each repeat's KV record, and
`apply_stretch` records one iteration row per repeat. Everything must be bit-identical to stepping the same
iterations one at a time."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import simpy
from conftest import AffineCost
from hypothesis import given, settings
from hypothesis import strategies as st

import simctl.serving.loop
from simctl.costs.base import ScaledCost
from simctl.costs.fitted import Fitted
from simctl.costs.roofline import Roofline
from simctl.policies.kv import PagedKV
from simctl.policies.plan import hybrid
from simctl.policies.registry import make_policy
from simctl.policies.sarathi import SarathiServe
from simctl.policies.seq import Phase, Seq
from simctl.serving.inbox import Inbox
from simctl.serving.loop import Replica
from simctl.serving.routers import make_router
from simctl.sim.cluster import Cluster, Member, Pool
from simctl.sim.replica import CostBackend, SimulatedTime
from simctl.sim.simulate import simulate
from simctl.traces.request import Request

SHIPPED_FIT = (Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu"
    / "cost_model.json")
COSTS = {
    "affine": AffineCost(),  # the generic CostModel.stretch_times
    "mistral": Roofline("mistral-7b", "a100-80gb"),
    "scaled": ScaledCost(Roofline("tiny", "a100-80gb"), 1.7),
    "cpu-fit": Fitted.load(SHIPPED_FIT),
}


def decoding(i: int, context: int, outputs: int = 50) -> Seq:
    """A running sequence whose prompt of `context` tokens is cached and whose first token is sampled."""
    s = Seq(i, 0.0, context, outputs)
    s.computed, s.generated, s.phase = context, 1, Phase.RUNNING
    return s


def sarathi_with_decodes(name: str, n: int, budget: int = 512):
    """`name` with `n` running decodes; hybrid-only's budget is the max model length (16,384 here)."""
    options = {} if name == "sarathi-hybrid-only" else {"token_budget": budget}
    policy = make_policy(name, 1_000_000, 16_384, options)
    for i in range(n):
        s = decoding(i, 10 + 7 * i)
        policy.kv.admit(s)
        policy.running.append(s)
    return policy


@pytest.mark.parametrize(("prompt", "repeats"), [(2000, 3), (1944, 2), (487, 0), (486, 0), (300, 0)])
def test_chunk_repeats_hand_cases(prompt: int, repeats: int) -> None:
    # 26 decodes leave 486 of the 512-token budget: a 2000-token prompt takes chunks 486 x 4 (mid-prompt) and
    # then its last 56 tokens, so the first plan repeats 3 more times; 1944 = 4 x 486 ends on a full chunk,
    # which samples a token and so is not a repeat; a prompt that fits in one or two chunks never repeats
    policy = sarathi_with_decodes("sarathi", 26)
    policy.add(Seq(100, 0.0, prompt, 5))
    plan = policy.schedule()
    assert plan.decode_tokens == 26 and plan.num_new[26] == min(prompt, 486)
    assert policy.chunk_repeats(plan) == repeats


def test_chunk_repeats_only_where_the_next_iteration_is_the_same() -> None:
    unchunked = sarathi_with_decodes("sarathi-hybrid-only", 4)
    unchunked.add(Seq(100, 0.0, 5000, 5))
    assert unchunked.chunk_repeats(unchunked.schedule()) == 0  # whole prompts: the prefill is its last chunk
    alone = sarathi_with_decodes("sarathi-chunked-only", 0)
    alone.add(Seq(100, 0.0, 5000, 5))
    plan = alone.schedule()  # chunked prefills in iterations of their own: 512-token chunks, 9 mid-prompt
    assert plan.decode_tokens == 0 and plan.num_new == [512] and alone.chunk_repeats(plan) == 8
    turns = sarathi_with_decodes("sarathi-chunked-only", 4)
    turns.add(Seq(100, 0.0, 5000, 5))
    plan = turns.schedule()  # the same chunk, but the 4 decodes take the next iteration
    assert plan.decode_tokens == 0 and plan.num_new == [512] and turns.chunk_repeats(plan) == 0
    two = sarathi_with_decodes("sarathi", 4)
    two.add(Seq(100, 0.0, 100, 5))
    two.add(Seq(101, 0.0, 5000, 5))
    assert two.chunk_repeats(two.schedule()) == 0  # two prefills in the plan: the first one ends now
    orca = make_policy("orca", 1_000_000, 16_384, {})
    orca.add(Seq(100, 0.0, 5000, 5))
    assert orca.chunk_repeats(orca.schedule()) == 0


@pytest.mark.parametrize("cost", list(COSTS))
def test_stretch_prices_each_repeat_as_its_iteration(cost: str) -> None:
    model = COSTS[cost]
    decodes = [decoding(i, 100 + 333 * i) for i in range(5)]
    prompt = Seq(9, 0.0, 5000, 3)
    prompt.computed = 700
    k = 6
    fast = model.stretch_times(hybrid(decodes, [prompt], [400]), k)
    slow = []
    for _ in range(k):  # advance the sequences as the iterations would, and price each plan afresh
        slow.append(model.iteration_time(hybrid(decodes, [prompt], [400])))
        for s in decodes:
            s.computed += 1
        prompt.computed += 400
    assert fast.tolist() == slow  # exactly


@settings(max_examples=60, deadline=None)
@given(block=st.sampled_from([1, 3, 16]), contexts=st.lists(st.integers(1, 200), max_size=8),
       k=st.integers(1, 40))
def test_used_while_growing_is_what_stepping_holds(block: int, contexts: list[int], k: int) -> None:
    kv = PagedKV(1_000_000, block_size=block, watermark=0.0)
    seqs = [decoding(i, c) for i, c in enumerate(contexts)]
    for s in seqs:
        kv.admit(s)
    assert kv.grow_each(seqs)  # this iteration's growth, as schedule() makes it
    profile = kv.used_while_growing(seqs, k)
    held = []
    for _ in range(k):  # stepping: record, advance, grow for the next iteration
        held.append(kv.used)
        for s in seqs:
            s.computed += 1
        assert kv.grow_each(seqs)
    assert profile == held


def _requests(draw: st.DrawFn) -> list[Request]:
    n = draw(st.integers(1, 14))
    gaps = draw(st.lists(st.sampled_from([0.0, 0.01, 0.2, 1.5]), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    return [Request(i, float(a), p, o) for i, (a, p, o) in enumerate(zip(np.cumsum(gaps), prompts, outputs))]


def _run(name: str, requests: list[Request], capacity: int, budget: int | None, cost: str, chunks: bool,
         give_up: int | None = None):
    policy = make_policy(name, capacity, 3072, {"token_budget": budget})
    if not chunks:
        policy.chunk_repeats = lambda plan: 0  # step every chunk; decode stretches stay as they are
    return simulate(list(requests), policy, COSTS[cost], fast=True, max_waiting=give_up), policy


def _assert_identical(a, b) -> None:
    pd.testing.assert_frame_equal(a.requests, b.requests, check_exact=True)
    pd.testing.assert_frame_equal(a.iterations.frame(), b.iterations.frame(), check_exact=True)
    assert np.array_equal(a.gaps.counts, b.gaps.counts) and a.gaps.total == b.gaps.total
    assert np.array_equal(a.queue_at_arrival, b.queue_at_arrival) and a.aborted == b.aborted


@settings(max_examples=40, deadline=None)
@given(data=st.data(), name=st.sampled_from(["sarathi", "sarathi-chunked-only"]),
       budget=st.sampled_from([None, 32, 128]), cost=st.sampled_from(list(COSTS)),
       spare=st.sampled_from([0, 40, 100_000]), give_up=st.sampled_from([None, None, 1, 3]))
def test_chunk_stretches_are_bit_identical_to_stepping(data, name, budget, cost, spare, give_up) -> None:
    # fresh requests arriving during a chunk stretch only wait; `give_up`: the run stops once that many more
    # wait, at the same iteration either way
    requests = _requests(data.draw)
    capacity = 3072 + 64 + spare  # tight: preemptions among the chunks; or plenty
    (stretched, policy), (stepped, _) = (_run(name, requests, capacity, budget, cost, c, give_up)
                                         for c in (True, False))
    _assert_identical(stretched, stepped)
    assert stretched.aborted or (policy.kv.used == 0 and policy.idle)


def test_no_chunk_stretch_while_caching_prefixes() -> None:
    # found by hypothesis (test_conformance): sarathi's own chunk_repeats shadowed the caching mixin's, so a
    # chunk stretch ran request 3's first 16 prompt tokens without scheduling them, its block was never
    # hashed, and after its preemption its re-admission missed the 16 tokens that stepping finds cached
    spec = [(1, 1), (40, 10), (1, 1), (29, 36), (1, 1), (1, 1), (1, 1), (1, 1), (1, 1)]
    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(spec)]
    runs = []
    for fast in (True, False):
        policy = make_policy("sarathi", 80, 65, {"enable_prefix_caching": 1, "token_budget": 3})
        runs.append((simulate(requests, policy, AffineCost(), fast=fast), policy.stats()))
    (fast_run, fast_stats), (stepped, stepped_stats) = runs
    pd.testing.assert_frame_equal(fast_run.requests, stepped.requests, check_exact=True)
    assert fast_stats == stepped_stats and stepped_stats["prefix_cache_preempted_hits"] == 16


def _serve_with_kv_arrivals(chunks: bool) -> tuple[list[Seq], pd.DataFrame]:
    """Fresh and prefilled requests (arriving with their KV, as on a disaggregated decode instance) on one
    replica: a prefilled arrival may join the decodes, so it stops a chunk stretch."""
    policy = make_policy("sarathi", 100_000, 3072, {"token_budget": 256})
    if not chunks:
        policy.chunk_repeats = lambda plan: 0
    seqs = []
    for i in range(40):
        s = Seq(i, 0.03 * i, 2900 if i % 5 == 0 else 40, 30)
        if i % 3 == 1:  # prefilled elsewhere: KV cached, first token sampled at arrival
            s.computed, s.generated = s.prompt_tokens, 1
            s.first_scheduled_s = s.first_token_s = s.last_token_s = s.arrival_s
        seqs.append(s)
    replica = Replica(policy, CostBackend(COSTS["mistral"]), SimulatedTime(), Inbox(seqs))
    for _ in replica.serve():  # a lone replica: its waits need no driver
        pass
    return seqs, replica.records.iterations.frame()


def test_a_request_arriving_with_its_kv_stops_a_chunk_stretch() -> None:
    seqs, log = _serve_with_kv_arrivals(True)
    stepped, stepped_log = _serve_with_kv_arrivals(False)
    times = ("first_scheduled_s", "first_token_s", "completion_s", "max_gap_s", "generated", "preemptions")
    assert [[getattr(s, a) for a in times] for s in seqs] == [[getattr(s, a) for a in times] for s in stepped]
    pd.testing.assert_frame_equal(log, stepped_log, check_exact=True)


def test_a_long_prompt_beside_decodes_is_one_stretch(monkeypatch) -> None:
    calls = []
    apply = simctl.serving.loop.apply_stretch

    def counting(policy, records, plan, start, ends, kv_used=None):
        calls.append((plan.decode_tokens, len(ends), kv_used is not None))
        return apply(policy, records, plan, start, ends, kv_used)

    requests = [Request(i, 0.001 * i, 20, 400) for i in range(8)] + [Request(8, 0.5, 3000, 3)]
    monkeypatch.setattr(simctl.serving.loop, "apply_stretch", counting)
    stretched, _ = _run("sarathi", requests, 100_000, None, "mistral", True)
    chunk_stretches = [c for c in calls if c[2]]
    # 8 decodes leave 504 tokens of the budget: 3000 = 5 x 504 + 480, so the first chunk repeats 4 more times
    assert chunk_stretches == [(8, 5, True)]
    monkeypatch.setattr(simctl.serving.loop, "apply_stretch", apply)
    _assert_identical(stretched, _run("sarathi", requests, 100_000, None, "mistral", False)[0])


def _cluster(requests: list[Request], replicas: int) -> tuple[list[Seq], list[pd.DataFrame]]:
    """Serve on `replicas` sarathi replicas behind a round-robin router: a cluster's stretches are cut by
    pushes while they run (`Replica.stretch`, the loop resumed early)."""
    cluster = Cluster(simpy.Environment(), None, 0)
    cluster.entry = Pool("replicas", [
        Member(i, make_policy("sarathi", 40_000, 3072, {"token_budget": 128}), CostBackend(COSTS["mistral"]),
               None, cluster.on_release) for i in range(replicas)], make_router("round-robin"))
    seqs = cluster.run(requests)
    return seqs, [m.replica.records.iterations.frame() for m in cluster.members]


def test_a_cluster_s_chunk_stretches_cut_by_pushes_are_bit_identical(monkeypatch) -> None:
    rng = np.random.default_rng(3)
    requests = [Request(i, float(t), int(p), int(o)) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(0.05, 60)), rng.integers(1, 3000, 60), rng.integers(1, 80, 60)))]
    calls = []
    apply = simctl.serving.loop.apply_stretch

    def counting(policy, records, plan, start, ends, kv_used=None):
        calls.append(kv_used is not None)
        return apply(policy, records, plan, start, ends, kv_used)

    monkeypatch.setattr(simctl.serving.loop, "apply_stretch", counting)
    seqs, logs = _cluster(requests, 2)
    assert sum(calls) > 10  # chunk stretches ran
    monkeypatch.setattr(SarathiServe, "chunk_repeats", lambda self, plan: 0)
    stepped, stepped_logs = _cluster(requests, 2)
    times = ("first_scheduled_s", "first_token_s", "completion_s", "max_gap_s", "generated", "preemptions")
    assert [[getattr(s, a) for a in times] for s in seqs] == [[getattr(s, a) for a in times] for s in stepped]
    for a, b in zip(logs, stepped_logs):
        pd.testing.assert_frame_equal(a, b, check_exact=True)
