"""A staged workload sent drained (`sim.cluster.Staged`), as inference-perf sends a load ladder: a stage's
requests only once every request of the earlier stages has completed, plus a pause. By hand on a cost of one
second per iteration; hypothesis over random staged traces on 1-3 replicas or a prefill/decode split."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_closed_loop import Second
from test_cluster import COST, check_invariants, deployment

from simctl.serving.records import request_frame
from simctl.traces.request import Request


def test_the_second_stage_is_sent_the_pause_after_the_first_stage_completed() -> None:
    """One replica (vllm: a prefill runs alone, before decodes), a second per iteration: request 0 prefills
    in [0, 1), request 1 (sent at 0.5 s) in [1, 2), both decode in [2, 3) (request 1 completes at 3 s) and
    request 0 its last token in [3, 4). Stage 1's requests, due at 1 and 1.5 s, are sent 0.5 s after the
    stage's last completion: at 4.5 and 5 s, their gap kept; the first is prefilled in [4.5, 5.5)."""
    reqs = [Request(0, 0.0, 10, 3), Request(1, 0.5, 10, 2), Request(2, 1.0, 10, 1), Request(3, 1.5, 10, 1)]
    seqs = deployment("vllm", Second()).run(reqs, stages=[0, 0, 1, 1], pause_s=0.5)
    assert [s.completion_s for s in seqs[:2]] == [4.0, 3.0]
    assert [s.arrival_s for s in seqs[2:]] == [4.5, 5.0]
    assert seqs[2].first_token_s == 5.5


def test_a_stage_due_after_the_drain_keeps_its_arrivals() -> None:
    reqs = [Request(0, 0.0, 10, 2), Request(1, 10.0, 10, 1)]
    seqs = deployment("vllm", Second()).run(reqs, stages=[0, 1], pause_s=1.0)
    assert [s.arrival_s for s in seqs] == [0.0, 10.0]


def test_stages_must_not_decrease() -> None:
    with pytest.raises(ValueError):
        deployment("vllm", Second()).run([Request(0, 0.0, 10, 2), Request(1, 1.0, 10, 1)], stages=[1, 0])


shapes = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 300), st.integers(1, 30), st.integers(0, 3)),
                  min_size=1, max_size=20)
layouts = st.sampled_from([(1, None), (2, None), (3, None), (1, (1, 1)), (2, (2, 1))])


def staged(shape: list[tuple[float, int, int, int]]) -> tuple[list[Request], list[int]]:
    """Requests in arrival order and their stages, non-decreasing (sorted by stage, then arrival)."""
    shape = sorted(shape, key=lambda r: (r[3], r[0]))
    return [Request(i, t, p, o) for i, (t, p, o, _) in enumerate(shape)], [k for *_, k in shape]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, layout=layouts, pause=st.sampled_from([0.0, 0.3]), policy=st.sampled_from(["vllm-v1",
                                                                                                 "sarathi"]))
def test_every_request_is_served_once_and_no_stage_starts_before_the_earlier_ones_completed(
        shape, layout, pause, policy) -> None:
    reqs, stages = staged(shape)
    replicas, split = layout
    cluster = deployment(policy, COST, replicas, "least-outstanding", split, kv=3000)
    seqs = cluster.run(reqs, stages=stages, pause_s=pause)
    check_invariants(cluster, seqs)
    for r, s in zip(reqs, seqs):
        assert s.output_tokens == s.generated == r.output_tokens
        assert s.arrival_s >= r.arrival_s  # shifted later only
    for k in set(stages) - {min(stages)}:
        before = [s for s, j in zip(seqs, stages) if j < k]
        mine = [s for s, j in zip(seqs, stages) if j == k]
        first = min(s.arrival_s for s in mine)
        assert first >= max(s.completion_s for s in before) + pause - 1e-9
        shift = first - min(r.arrival_s for r, j in zip(reqs, stages) if j == k)
        assert all(abs(s.arrival_s - r.arrival_s - shift) < 1e-9  # the stage's gaps kept
                   for r, s, j in zip(reqs, seqs, stages) if j == k)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=shapes, layout=layouts, policy=st.sampled_from(["vllm-v1", "sarathi", "orca"]))
def test_one_stage_is_the_open_loop(shape, layout, policy) -> None:
    reqs, _ = staged([(t, p, o, 0) for t, p, o, _ in shape])
    replicas, split = layout
    open_loop = deployment(policy, COST, replicas, "least-outstanding", split, kv=3000).run(reqs)
    one = deployment(policy, COST, replicas, "least-outstanding", split, kv=3000).run(
        reqs, stages=[7] * len(reqs), pause_s=1.0)
    assert request_frame(open_loop).equals(request_frame(one))
