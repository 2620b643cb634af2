"""Driving a policy through the contract in `policies/base.py` step by step, checking every plan, and drawing
policies with their settings from the settings' declared bounds: shared by the conformance suite and the
tests of each paper's algorithm."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from simctl.common.errors import InputError
from simctl.policies.admission import waiting_queue
from simctl.policies.base import Policy
from simctl.policies.kv import PagedKV, ReservedKV
from simctl.policies.padded_kv import PaddedBatchKV
from simctl.policies.plan import BatchPlan, Layout
from simctl.policies.registry import POLICIES, max_admissible_tokens
from simctl.policies.seq import Phase, Seq
from simctl.serving.inbox import Inbox
from simctl.serving.loop import Replica

# ----------------------------------------------------------------------------------------------------------
# the driver
# ----------------------------------------------------------------------------------------------------------


@dataclass
class Row:
    seq: Seq
    q: int
    prefill: bool  # in prefill when scheduled
    computed: int  # cached tokens when scheduled
    remaining: int  # prefill tokens pending when scheduled (0 for a decode)


@dataclass
class Step:
    plan: BatchPlan
    rows: list[Row]
    extra: int  # extra repeats granted by extend()
    running_before: list[Seq]
    waiting_before: list[Seq]
    head_admittable: bool  # the head of the queue fit (batch room and KV) right before schedule()
    decoding_before: list[Seq]  # running and past their prefill, right before schedule()
    prefilling_before: list[Seq]  # running with a partial prefill, right before schedule()
    running_after: list[Seq]
    waiting_after: list[Seq]
    admittable_after: bool  # the head of the queue would still fit right after schedule()
    head_after_remaining: int  # prefill tokens the head of the queue needs, right after schedule()
    kv_used: int  # after schedule() and extend()
    requeued: list[Seq]  # the waiting ones not admitted and those preempted, in the queue's order
    kv_used_end: int = 0  # after the finishes of this step
    finished: list[Seq] = field(default_factory=list)

    @property
    def ids(self) -> list[int]:
        return [r.seq.id for r in self.rows]

    @property
    def has_prefill(self) -> bool:
        return any(r.prefill for r in self.rows)

    @property
    def has_decode(self) -> bool:
        return any(not r.prefill for r in self.rows)


def head_admittable(policy: Policy) -> bool:
    return (bool(policy.waiting) and len(policy.running) < policy.max_batch_size
            and policy.kv.can_admit(policy.waiting.head()))


def kv_covers(kv: object, s: Seq, tokens: int) -> bool:
    """Whether the KV manager holds room for `tokens` cached tokens of `s`."""
    if isinstance(kv, PagedKV):
        return s.id in kv.held and kv.held[s.id] >= tokens
    if isinstance(kv, PaddedBatchKV):
        return s.id in kv.rows and tokens <= kv.width
    assert isinstance(kv, ReservedKV)
    return s.id in kv.holders and tokens <= kv.reserve_tokens


class Checked:
    """The replica loop's clock, backend and watch for `drive`: every iteration takes one unit of time, any
    plan may be priced repeated (the loop stretches those its policy repeats), and every plan is checked as
    it is made and once it ran."""

    def __init__(self, policy: Policy, max_steps: int) -> None:
        self.policy, self.max_steps = policy, max_steps
        self.steps: list[Step] = []
        self.finishes: Counter[int] = Counter()
        self.before: tuple[list[Seq], list[Seq], bool, list[Seq], list[Seq]] = ([], [], False, [], [])
        self.generated: list[int] = []  # of the plan's sequences, before it ran

    # ---- clock and backend ---------------------------------------------------------------------------------
    def now(self, exact: float) -> float:
        return exact

    def run(self, plan: BatchPlan, start: float) -> float:
        return start + 1

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray | None:
        return np.ones(k)

    def release(self, finished: list[Seq]) -> None:
        pass

    # ---- watch ---------------------------------------------------------------------------------------------
    def scheduling(self) -> None:
        policy = self.policy
        running = list(policy.running)
        self.before = (running, list(policy.waiting), head_admittable(policy),
                       [s for s in running if not s.in_prefill], [s for s in running if s.in_prefill])

    def planned(self, plan: BatchPlan | None, extra: int) -> None:
        policy = self.policy
        if plan is None:
            # the KV always fits the largest request alone, so nothing runnable means nothing at all
            assert policy.idle, "schedule() returned None with work pending"
            return
        assert len(self.steps) < self.max_steps, "no progress"
        running_before, waiting_before, admittable, decoding, prefilling = self.before
        running_after, waiting_after = list(policy.running), list(policy.waiting)
        victims = []
        for v in running_before:  # left the running set without finishing: preempted by recompute, or its
            if v not in running_after:  # KV moved off the device (Baton), back with it
                assert v.phase is Phase.WAITING
                if v not in policy.arrived_with_kv:
                    assert v.computed == 0 and v.prefill_end == v.known_tokens
                    assert v.preemptions >= 1 and v in waiting_after
                    victims.append(v)
        # now, while the keys of the queue's order are those it sorted by
        requeued = requeue(policy, [s for s in waiting_before if s in waiting_after], victims)
        assert extra >= 0
        rows = [Row(s, q, s.in_prefill, s.computed, s.prefill_remaining)
                for s, q in zip(plan.seqs, plan.num_new)]
        step = Step(plan, rows, extra, running_before, waiting_before, admittable, decoding, prefilling,
                    running_after, waiting_after, head_admittable(policy),
                    waiting_after[0].prefill_remaining if waiting_after else 0, policy.kv.used, requeued)
        check_plan(policy, step)
        self.steps.append(step)
        self.generated = [s.generated for s in plan.seqs]

    def ran(self, plan: BatchPlan, finished: list[Seq]) -> None:
        step = self.steps[-1]
        assert step.plan is plan
        sampled = [s.generated - g for s, g in zip(plan.seqs, self.generated)]
        # every repeat samples a token of every decode; a repeated chunk stays short of its prompt's end
        assert all(n == (1 + step.extra if not r.prefill else 0 if step.extra else n)
                   for n, r in zip(sampled, step.rows))
        assert all(s.generated <= s.output_tokens for s in plan.seqs)
        if plan.layout is Layout.PACKED:
            assert sum(sampled) == plan.sampled_tokens * (1 + step.extra)
        step.finished = [s for s in plan.seqs if s.generated == s.output_tokens]
        assert finished == step.finished  # released by the loop, each once it sampled its last token
        for s in finished:
            self.finishes[s.id] += 1
            assert s.phase is Phase.FINISHED
        step.kv_used_end = self.policy.kv.used


def drive(policy: Policy, seqs: list[Seq], gaps: list[int] | None = None, extend_cap: int = 0,
          max_steps: int = 100_000) -> list[Step]:
    """Run `seqs` to completion through the replica loop (`simctl.serving.loop`), each iteration one unit of
    time. Request i arrives `gaps[i]` iterations after request i-1 (or at once when the policy has nothing to
    run), which sets its `arrival_s`. With `extend_cap`, every decode-only plan, and every plan with a chunk
    its policy repeats (`chunk_repeats`), is repeated up to that many times, never past the first finish nor
    past the next arrival that matters (its repeats count as iterations). Checks every plan as it is made
    and, at the end, that each request finished once with all its tokens."""
    gaps = gaps if gaps is not None else [0] * len(seqs)
    arrival = 0
    for i, s in enumerate(seqs):
        arrival += gaps[i] if i else 0
        s.arrival_s = float(arrival)
    checked = Checked(policy, max_steps)
    inbox = Inbox(seqs)
    replica = Replica(policy, checked, checked, inbox, max_stretch=extend_cap + 1, watch=checked)
    for _ in replica.serve():
        pass  # no time passes: each iteration's end is its start plus one
    assert inbox.next_time == float("inf")
    finishes = checked.finishes
    assert all(finishes[s.id] == 1 for s in seqs) and sum(finishes.values()) == len(seqs)
    assert all(s.generated == s.output_tokens for s in seqs)
    assert policy.idle and policy.kv.used == 0
    return checked.steps


def check_plan(policy: Policy, step: Step) -> None:
    """What every plan of every policy must satisfy, checked before the plan is executed."""
    plan, kv = step.plan, policy.kv
    assert plan.seqs and len(plan.seqs) == len(plan.num_new) == len({s.id for s in plan.seqs})
    assert len(policy.running) <= policy.max_batch_size
    assert 0 <= kv.used <= kv.capacity
    # a prefill apart from the batch (`concurrent_streams`: Baton-PD's overlap, on a second stream or alone
    # once the batch ran out) is of a query with no row yet, its KV held apart until it is embedded
    ahead = {s.id for s in policy.prefilling_apart()}
    assert {s.id for p in plan.streams[1:] for s in p.seqs} <= ahead
    assert not ahead or policy.concurrent_streams
    for r in step.rows:
        s = r.seq
        assert s.phase is Phase.RUNNING and (s in policy.running) != (s.id in ahead)
        assert r.q >= 1
        if r.prefill:
            assert r.q * (1 + step.extra) <= r.remaining
        else:
            assert r.q == 1
        # the KV for everything this plan (and its repeats) caches is already held
        assert s.id in ahead or kv_covers(kv, s, s.computed + r.q * (1 + step.extra))
    if plan.layout is Layout.PACKED:
        assert plan.linear_tokens == sum(plan.num_new)
        assert plan.decode_rows == sum(1 for r in step.rows if not r.prefill)
        assert plan.prefill_q == [r.q for r in step.rows if r.prefill]
        assert plan.prefill_c == [r.computed for r in step.rows if r.prefill]
        assert plan.decode_kv == sum(r.computed + 1 for r in step.rows if not r.prefill)


def make_seqs(spec: list[tuple[int, int]]) -> list[Seq]:
    return [Seq(i, float(i), p, o) for i, (p, o) in enumerate(spec)]


def add(policy: Policy, *seqs: Seq) -> None:
    for s in seqs:
        policy.add(s)


def run_plan(policy: Policy, plan: BatchPlan) -> None:
    """Execute one plan by hand: advance and finish."""
    for s, q in zip(plan.seqs, plan.num_new):
        s.advance(q)
    for s in plan.seqs:
        if s.generated == s.output_tokens:
            policy.finish(s)


def shape(plan: BatchPlan) -> list[tuple[int, int]]:
    return [(s.id, q) for s, q in zip(plan.seqs, plan.num_new)]


def big_paged(tokens: int = 1 << 16) -> PagedKV:
    return PagedKV(tokens, watermark=0.0)



def requeue(policy: Policy, waiting: list[Seq], victims: list[Seq]) -> list[Seq]:
    """The waiting queue once `victims`, preempted newest first, are back in it: in arrival order they wait
    first, in the other orders where their key puts them."""
    queue = waiting_queue(policy.admission_order)
    for s in waiting:
        queue.add(s)
    for v in reversed(victims):
        queue.requeue(v)
    return list(queue)


# ----------------------------------------------------------------------------------------------------------
# policies and workloads drawn: settings within their declared bounds
# ----------------------------------------------------------------------------------------------------------


def setting_values(cls: type[Policy]) -> st.SearchStrategy[dict[str, Any]]:
    """Every setting of the policy: not given (its default, or the deployment's), or drawn from its declared
    choices or bounds."""
    drawn = {}
    for name, f in cls.Settings.__dataclass_fields__.items():
        m = f.metadata
        value = st.sampled_from(m["choices"]) if "choices" in m else st.integers(m["min"], m["max"])
        drawn[name] = st.one_of(st.none(), value)
    return st.fixed_dictionaries(drawn)


def least_capacity(name: str, longest: int, max_seq_len: int, options: dict[str, Any]) -> int:
    """The least KV capacity on which the policy, so set, can run a request of `longest` tokens."""
    def fits(cap: int) -> bool:
        return max_admissible_tokens(name, cap, max_seq_len, options) >= longest

    lo = hi = max(longest, max_seq_len)
    while not fits(hi):  # double, then bisect: a drawn block size may be far larger than the request
        lo, hi = hi + 1, 2 * hi
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if fits(mid) else (mid + 1, hi)
    return lo


def build(draw: st.DrawFn, name: str, longest: int, max_seq_len: int, spare: list[int]) -> Policy:
    """Policy `name` with drawn settings on a KV capacity that fits its longest request alone plus one of
    `spare` (0: preemptions galore for the paged policies); a combination it refuses (InputError) is
    skipped."""
    options = draw(setting_values(POLICIES[name]), label="settings")
    try:
        least = least_capacity(name, longest, max_seq_len, options)
        return POLICIES[name].build(least + draw(st.sampled_from(spare)), max_seq_len, options)
    except InputError:
        assume(False)
        raise


@dataclass
class Case:
    policy: Policy
    seqs: list[Seq]
    gaps: list[int]
    extend_cap: int


@st.composite
def cases(draw: st.DrawFn, name: str, extend: bool) -> Case:
    """A few small requests (a few shared prefixes, a few priorities) arriving 0 to 8 iterations apart."""
    n = draw(st.integers(1, 10))
    seqs = []
    for i in range(n):
        prompt, group = draw(st.integers(1, 64)), draw(st.integers(-1, 1))
        seqs.append(Seq(i, float(i), prompt, draw(st.integers(1, 64)), draw(st.integers(0, 2)), group,
                        draw(st.integers(0, prompt)) if group >= 0 else 0))
    gaps = [draw(st.sampled_from([0, 0, 0, 1, 2, 3, 8])) for _ in range(n)]
    longest = max(s.max_len for s in seqs)
    max_seq_len = longest + draw(st.sampled_from([0, 0, 1, 16]))
    policy = build(draw, name, longest, max_seq_len, [0, 0, 15, 16, max_seq_len, 3 * max_seq_len, 1 << 16])
    return Case(policy, seqs, gaps, draw(st.integers(1, 40)) if extend else 0)
