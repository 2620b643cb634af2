"""Closed-loop clients and session turns in the simulated cluster (issue 37): a request is sent when
`serving.clients.Clients` says, timed from its send. By hand on a cost of one second per iteration; hypothesis
runs random sessions through every policy on one or two replicas, or a prefill/decode split, with and
without a client bound, and checks what must always hold."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_cluster import deployment

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.base import CostModel
from simctl.costs.loader import load_cost
from simctl.policies.plan import BatchPlan
from simctl.policies.registry import POLICIES, make_policy
from simctl.policies.seq import Seq
from simctl.serving.records import request_frame
from simctl.sim.cluster import Cluster, Member, Pool
from simctl.sim.replica import CostBackend
from simctl.sim.run import RunConfig, run
from simctl.traces.request import Request
from simctl.traces.workload import Workload

TINY = get_model("tiny")
CPU_COST = load_cost(None, TINY, get_gpu("cpu")).cost
MAX_SEQ_LEN = 1024
CONTINUOUS = [n for n, c in POLICIES.items() if not c.padded_batches]  # can admit a request with its KV


class Second(CostModel):
    """Every iteration takes one second: times a test can count."""

    def iteration_time(self, plan: BatchPlan) -> float:
        return 1.0

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        return np.ones(k)


def serve(policy: str, requests: list[Request], concurrency: int | None = None, think_s: float = 0.0,
          replicas: int = 1, split: tuple[int, int] | None = None, kv: int = 100_000,
          cost: CostModel = CPU_COST) -> tuple[Cluster, list[Seq]]:
    cluster = deployment(policy, cost, replicas, "least-outstanding", split, kv, max_seq_len=MAX_SEQ_LEN)
    return cluster, cluster.run(requests, concurrency=concurrency, think_s=think_s)


def test_one_client_sends_the_second_request_its_think_time_after_the_first_completed() -> None:
    """Prompt then one decode a second: request 0 (2 outputs) completes at 2 s; the client thinks 0.5 s, so
    request 1, ready since t=0, is sent at 2.5 s, its prefill ends at 3.5 s and its 3 tokens at 5.5 s."""
    _, seqs = serve("vllm", [Request(0, 0.0, 10, 2), Request(1, 0.0, 10, 3)], concurrency=1, think_s=0.5,
                    cost=Second())
    assert [(s.arrival_s, s.first_token_s, s.completion_s) for s in seqs] == [(0.0, 1.0, 2.0),
                                                                              (2.5, 3.5, 5.5)]


def test_a_request_sent_at_a_completion_joins_the_iteration_starting_then() -> None:
    """Two clients, no think time: request 2 is sent when request 0 completes (2 s) and is prefilled in the
    iteration that starts then, beside request 1's decode (Sarathi mixes them), as an open-loop arrival at
    that instant would."""
    reqs = [Request(0, 0.0, 10, 2), Request(1, 0.0, 10, 4), Request(2, 0.0, 10, 2)]
    _, seqs = serve("sarathi", reqs, concurrency=2, cost=Second())
    assert [(s.arrival_s, s.first_token_s, s.completion_s) for s in seqs] == [(0.0, 1.0, 2.0),
                                                                              (0.0, 1.0, 4.0),
                                                                              (2.0, 3.0, 4.0)]


def test_a_session_turn_is_sent_its_own_think_time_after_the_turn_before_it() -> None:
    """Open loop with sessions: the second turn (prompt = the first's 10 + its 2 answers + 4 new tokens) is
    sent 0.25 s after the first completed, whatever its arrival_s says; an unrelated request arrives as
    given."""
    reqs = [Request(0, 0.0, 10, 2, session=0), Request(1, 0.0, 16, 2, session=0, previous=0, think_s=0.25),
            Request(2, 10.0, 10, 1)]
    _, seqs = serve("vllm", reqs, cost=Second())
    assert seqs[1].arrival_s == 2.25 and seqs[1].first_token_s == 3.25
    assert seqs[2].arrival_s == 10.0


def test_a_lone_replica_in_closed_loop_is_the_routed_replica_of_two() -> None:
    """The routed path (every request pushed when sent) for one replica equals routing every request to
    replica 0 of two."""
    reqs = _sessions(np.random.default_rng(3), 12)
    lone = request_frame(serve("sarathi", reqs, concurrency=3)[1])
    cluster = Cluster(simpy.Environment(), None, TINY.kv_bytes_per_token())
    cluster.entry = Pool("replicas", [Member(i, make_policy("sarathi", 100_000, MAX_SEQ_LEN, {}),
                                             CostBackend(CPU_COST), None, cluster.on_release)
                                      for i in range(2)], lambda views, seq: 0)
    routed = request_frame(cluster.run(reqs, concurrency=3))
    assert not cluster.entry.members[1].seqs
    assert lone.equals(routed)


def _sessions(rng: np.random.Generator, n: int) -> list[Request]:
    """`n` requests in sessions of 1-4 turns: a turn's prompt is its session's context (earlier prompts and
    answers) plus new tokens; first turns arrive over 2 s, later ones follow their predecessor."""
    out: list[Request] = []
    while len(out) < n:
        start, context, previous, session = float(rng.uniform(0, 2)), 0, -1, len(out)
        for _ in range(int(rng.integers(1, 5))):
            prompt, answer = context + int(rng.integers(1, 60)), int(rng.integers(1, 20))
            out.append(Request(len(out), start, prompt, answer, session=session, previous=previous,
                               think_s=float(rng.choice([0.0, 0.1]))))
            context, previous = prompt + answer, len(out) - 1
    return sorted(out[:n], key=lambda r: (r.arrival_s, r.id))


def check_closed_loop(cluster: Cluster, seqs: list[Seq], requests: list[Request], concurrency: int | None,
                      think_s: float) -> None:
    by_id = {s.id: s for s in seqs}
    for r in requests:
        s = by_id[r.id]
        assert s.generated == s.output_tokens == r.output_tokens, s  # exactly its tokens
        assert s.arrival_s <= s.first_scheduled_s <= s.first_token_s <= s.completion_s, s
        if r.previous >= 0:  # never before its predecessor's completion plus its think time
            assert s.arrival_s >= by_id[r.previous].completion_s + r.think_s
        else:
            assert s.arrival_s >= r.arrival_s
    handed_on = sum(s.output_tokens > 1 for s in seqs) if cluster.decode else 0
    assert sum(m.released for m in cluster.members) == len(seqs) + handed_on  # each finishes once
    for m in cluster.members:
        assert m.replica.policy.kv.used == 0 and m.replica.policy.idle  # KV back to zero
    if concurrency is not None:  # a client is busy from a send until think_s after its completion
        events = sorted([(s.arrival_s, 1) for s in seqs] + [(s.completion_s + think_s, -1) for s in seqs])
        assert max(np.cumsum([e for _, e in events])) <= concurrency


sessions = st.builds(_sessions, st.integers(0, 2**32 - 1).map(np.random.default_rng), st.integers(1, 14))
settings_ = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@settings_
@given(reqs=sessions, policy=st.sampled_from(list(POLICIES)), replicas=st.integers(1, 2),
       concurrency=st.none() | st.integers(1, 4), think_s=st.sampled_from([0.0, 0.05]),
       kv=st.integers(1100, 3000))
def test_sessions_and_clients_on_replicas(reqs, policy, replicas, concurrency, think_s, kv) -> None:
    think_s = think_s if concurrency is not None else 0.0
    cluster, seqs = serve(policy, reqs, concurrency, think_s, replicas=replicas, kv=kv)
    check_closed_loop(cluster, seqs, reqs, concurrency, think_s)
    again = serve(policy, reqs, concurrency, think_s, replicas=replicas, kv=kv)[1]
    assert request_frame(seqs).equals(request_frame(again))  # same trace, same results


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=sessions, policy=st.sampled_from(CONTINUOUS),
       split=st.tuples(st.integers(1, 2), st.integers(1, 2)),
       concurrency=st.none() | st.integers(1, 4), think_s=st.sampled_from([0.0, 0.05]))
def test_sessions_and_clients_disaggregated(reqs, policy, split, concurrency, think_s) -> None:
    think_s = think_s if concurrency is not None else 0.0
    cluster, seqs = serve(policy, reqs, concurrency, think_s, split=split)
    check_closed_loop(cluster, seqs, reqs, concurrency, think_s)


def _run(**workload: Any) -> Any:
    return run(RunConfig(policy="vllm", model="tiny", gpu="cpu",
                         workload=Workload(trace="sharegpt", num_requests=40, scale=0.05, **workload)))


def test_a_closed_loop_without_a_rate_has_every_request_ready_at_once() -> None:
    """`vllm bench serve --max-concurrency 4 --request-rate inf`: the first four are sent at t=0, each later
    one when a request completes; the summary records the bound and the requests in flight on average."""
    r = _run(qps=None, concurrency=4)
    req = r.result.request_columns
    assert (req["arrival_s"][:4] == 0).all() and (req["arrival_s"][4:] > 0).all()
    assert set(req["arrival_s"][4:]) <= set(req["completion_s"])  # sent at a completion, no think time
    s = r.summary
    assert s["concurrency"] == 4 and s["qps"] is None
    span_s = req["completion_s"].max()
    assert s["in_flight_mean"] == pytest.approx((req["completion_s"] - req["arrival_s"]).sum() / span_s)
    assert 3 < s["in_flight_mean"] <= 4


def test_a_closed_loop_with_a_rate_sends_each_request_at_its_arrival_or_later() -> None:
    """With --qps: arrivals at the rate (the open loop's), at most N in flight, each sent when it is ready
    and a client is free."""
    open_loop = _run(qps=20.0).result.request_columns
    closed = _run(qps=20.0, concurrency=2).result.request_columns
    assert (closed["arrival_s"] >= open_loop["arrival_s"]).all()
    assert (closed["arrival_s"] > open_loop["arrival_s"]).any()  # some waited for a client
    assert (closed["prompt_tokens"] == open_loop["prompt_tokens"]).all()


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("replicas", [1, 2])
def test_a_bound_that_never_binds_gives_the_open_loop_bit_for_bit(policy: str, replicas: int) -> None:
    """As many clients as requests: each is sent at its arrival, routed then, so the run is the open loop's
    (a lone replica's arrivals taken ahead, or routed at their arrival)."""
    rng = np.random.default_rng(1)
    reqs = [Request(i, t, p, o) for i, (t, p, o) in enumerate(zip(
        np.cumsum(rng.exponential(0.05, 120)).tolist(), rng.integers(1, 300, 120).tolist(),
        rng.integers(1, 120, 120).tolist()))]
    open_loop = request_frame(serve(policy, reqs, replicas=replicas, kv=4000)[1])
    closed = request_frame(serve(policy, reqs, concurrency=len(reqs), replicas=replicas, kv=4000)[1])
    assert open_loop.equals(closed)
