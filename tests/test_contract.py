"""The policy contract the next policies need: admit a chosen waiting sequence, leave unfinished (`release`),
and admit a sequence whose KV is already there (prefilled elsewhere) straight as a decode."""

from __future__ import annotations

import pytest
from conftest import AffineCost
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simctl.policies.kv import PagedKV
from simctl.policies.registry import POLICIES, make_policy
from simctl.policies.sarathi import SarathiServe
from simctl.policies.seq import Phase, Seq
from simctl.policies.vllm import VLLM
from simctl.serving.inbox import Inbox
from simctl.serving.loop import Replica
from simctl.sim.replica import CostBackend, SimulatedTime


def prefilled(i: int, arrival: float, prompt: int, output: int) -> Seq:
    """A request whose prompt was prefilled elsewhere: its KV cached, its first token sampled at arrival."""
    s = Seq(i, arrival, prompt, output)
    s.computed, s.generated = prompt, 1
    s.first_scheduled_s = s.first_token_s = s.last_token_s = arrival
    return s


def test_admit_takes_the_chosen_sequence_not_the_head() -> None:
    policy = SarathiServe(PagedKV(10_000))
    seqs = [Seq(i, 0.0, 10 * (i + 1), 5) for i in range(3)]
    for s in seqs:
        policy.add(s)
    policy._admit(seqs[2])  # e.g. shortest-first or packing picks from the middle of the queue
    assert list(policy.waiting) == seqs[:2] and policy.running == [seqs[2]]
    assert policy.kv.used == 32  # two blocks of 16 for 30 prompt tokens


def test_release_frees_kv_and_keeps_progress() -> None:
    policy = VLLM(PagedKV(10_000), max_tokens=4096)
    a, b = Seq(0, 0.0, 40, 5), Seq(1, 0.0, 20, 5)
    policy.add(a)
    policy.add(b)
    plan = policy.schedule()
    for s, q in zip(plan.seqs, plan.num_new):
        s.advance(q)
    policy.release(a)  # handed to another instance after its prefill
    assert policy.running == [b] and policy.kv.used == 32 and a.phase is Phase.WAITING
    assert (a.computed, a.generated) == (40, 1)  # its progress travels with it
    waiting = Seq(2, 0.0, 8, 2)
    policy.add(waiting)
    policy.release(waiting)  # leaving from the queue works too
    assert not policy.waiting


@pytest.mark.parametrize("name", ["vllm", "vllm-v1", "sarathi", "orca"])
def test_prefilled_request_is_admitted_as_a_decode(name: str) -> None:
    policy = make_policy(name, 10_000, 512)
    s = prefilled(0, 0.0, 300, 4)
    policy.add(s)
    assert not policy.waiting and not policy.idle
    plan = policy.schedule()
    assert plan.seqs == [s] and plan.num_new == [1] and plan.decode_only and plan.decode_kv == 301


def test_faster_transformer_refuses_prefilled_requests() -> None:
    with pytest.raises(ValueError, match="prefilled elsewhere"):
        make_policy("faster-transformer", 10_000, 512).add(prefilled(0, 0.0, 10, 3))


class Spy(CostBackend):
    """Records how many new tokens each scheduled sequence processed."""

    def __init__(self) -> None:
        super().__init__(AffineCost())
        self.new_tokens: dict[int, list[int]] = {}

    def run(self, plan, start):
        for s, q in zip(plan.seqs, plan.num_new):
            self.new_tokens.setdefault(s.id, []).append(q)
        return super().run(plan, start)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(name=st.sampled_from([n for n, c in POLICIES.items() if not c.padded_batches]),
       reqs=st.lists(st.tuples(st.floats(0, 0.2), st.integers(1, 300), st.integers(1, 60), st.booleans()),
                     min_size=1, max_size=30),
       spare=st.integers(0, 2000))
def test_mixed_fresh_and_prefilled_arrivals(name: str, reqs: list, spare: int) -> None:
    capacity = 16 * (-(-400 // 16)) + spare  # always room for the longest request, often not for all
    policy = make_policy(name, capacity, 400)
    seqs, t = [], 0.0
    for i, (gap, prompt, output, pre) in enumerate(reqs):
        t += gap
        seqs.append(prefilled(i, t, prompt, output) if pre and output > 1 else Seq(i, t, prompt, output))
    came_with_kv = {s.id for s in seqs if s.computed}
    finished: list[int] = []
    finish = policy.finish
    policy.finish = lambda s: (finished.append(s.id), finish(s))[1]
    backend = Spy()
    replica = Replica(policy, backend, SimulatedTime(), Inbox(seqs))
    for _ in replica.serve():  # a lone replica: its waits need no driver
        pass
    assert sorted(finished) == [s.id for s in seqs]  # each exactly once
    assert all(s.generated == s.output_tokens and s.phase is Phase.FINISHED for s in seqs)
    assert policy.kv.used == 0 and policy.idle
    assert max(replica.records.iterations.kv_used, default=0) <= policy.kv.capacity
    for s in seqs:
        if s.id in came_with_kv and s.preemptions == 0:  # never prefilled here (a preemption recomputes)
            assert set(backend.new_tokens.get(s.id, [])) <= {1}
