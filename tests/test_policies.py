"""Each paper's algorithm, step by step (`policy_cases.drive`): hand-computed cases, and the algorithm's own
rules checked on every step of random small workloads (settings drawn from their declared bounds). What every
policy keeps whatever its algorithm is checked by capability in `tests/test_conformance.py`.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from policy_cases import Row, Step, add, big_paged, cases, drive, make_seqs, run_plan, shape

from simctl.policies.admission import highest_priority_first
from simctl.policies.base import Policy
from simctl.policies.binpack import first_fit_decreasing
from simctl.policies.faster_transformer import FasterTransformer
from simctl.policies.full_batching import HFPadded, LengthOrdered
from simctl.policies.kv import PagedKV, ReservedKV
from simctl.policies.orca import Orca
from simctl.policies.plan import Layout
from simctl.policies.prepack import Prepack
from simctl.policies.sarathi import ChunkedPrefillsOnly, HybridBatchingOnly, SarathiServe
from simctl.policies.seq import Phase, Seq
from simctl.policies.vllm import VLLM
from simctl.policies.vllm_v1 import VLLMV1

# ----------------------------------------------------------------------------------------------------------
# FasterTransformer
# ----------------------------------------------------------------------------------------------------------


def check_faster_transformer(policy: FasterTransformer, steps: list[Step]) -> None:
    """FasterTransformer and the request-level policies built on it (hf-padded, length-ordered, prepack)."""
    kv = policy.kv
    assert isinstance(kv, ReservedKV)
    batch: list[Seq] = []
    lmax = decodes = 0
    for st_ in steps:
        plan = st_.plan
        assert plan.layout is (Layout.BINPACKED if isinstance(policy, Prepack) and plan.prefill_q
                               else Layout.PADDED)
        if plan.prefill_q:  # a new batch: only when the previous one fully finished
            assert not st_.running_before
            batch = list(plan.seqs)
            assert 1 <= len(batch) <= policy.max_batch_size
            # admission in the queue's order, as many as the slots and the batch size allow
            assert batch == st_.waiting_before[:len(batch)]
            assert len(batch) == min(len(st_.waiting_before), policy.max_batch_size, kv.slots)
            assert all(r.prefill and r.computed == 0 and r.q == r.seq.prompt_tokens for r in st_.rows)
            lmax = max(s.prompt_tokens for s in batch)
            rows = len(plan.bins) if isinstance(policy, Prepack) else len(batch)
            if isinstance(policy, Prepack):  # every prompt in one row, rows within L_max, FFD's row count
                assert sorted(i for b in plan.bins for i in b) == list(range(len(batch)))
                assert all(sum(batch[i].prompt_tokens for i in b) <= lmax for b in plan.bins)
                assert rows == len(first_fit_decreasing([s.prompt_tokens for s in batch], lmax))
            assert plan.linear_tokens == rows * lmax  # padded B x L_max, or packed rows x L_max
            varlen = isinstance(policy, Prepack) and policy.settings.varlen  # attention within each prompt
            assert plan.sampled_tokens == len(batch)
            if varlen:
                assert sorted(plan.prefill_q) == sorted(s.prompt_tokens for s in batch)
            else:
                assert plan.prefill_q == [lmax] * rows
            assert plan.dense_attention == (isinstance(policy, HFPadded) and not varlen)
            decodes = 0
        else:  # a decode of the running batch: no newcomer, finished rows keep their slot
            assert all(not r.prefill for r in st_.rows)
            assert plan.seqs == st_.running_before == st_.running_after
            assert set(plan.seqs) <= set(batch)
            assert st_.waiting_after == st_.waiting_before
            assert plan.decode_rows == plan.linear_tokens == plan.sampled_tokens == len(batch)
            decodes += 1
            assert plan.decode_kv == len(batch) * (lmax + decodes)
            decodes += st_.extra
        # KV: every row holds its reservation until the whole batch is done
        assert st_.kv_used == len(batch) * kv.reserve_tokens
        live = len(st_.running_after) > len(st_.finished)
        assert st_.kv_used_end == (len(batch) * kv.reserve_tokens if live else 0)


def test_faster_transformer_hand_case() -> None:
    kv = ReservedKV(1000, 100)
    policy = FasterTransformer(kv, max_batch_size=3)
    a, b, c, d = make_seqs([(5, 3), (10, 6), (2, 1), (4, 2)])
    steps = drive(policy, [a, b, c, d])
    check_faster_transformer(policy, steps)
    assert [st_.ids for st_ in steps] == [[0, 1, 2], [0, 1], [0, 1], [1], [1], [1], [3], [3]]
    first = steps[0].plan
    assert first.linear_tokens == 30 and first.num_new == [5, 10, 2]
    # c finished at the prefill, a after two decodes: still three rows until b is done
    assert [st_.plan.decode_rows for st_ in steps[1:6]] == [3] * 5
    assert [st_.plan.decode_kv for st_ in steps[1:6]] == [3 * (10 + j) for j in range(1, 6)]
    assert [st_.kv_used_end for st_ in steps] == [300] * 5 + [0, 100, 0]
    # d arrived with the others but waited for the whole batch
    assert all(3 not in st_.ids for st_ in steps[:6])


def test_faster_transformer_admits_nothing_while_a_batch_runs() -> None:
    policy = FasterTransformer(ReservedKV(10_000, 100), max_batch_size=8)
    a = Seq(0, 0.0, 4, 5)
    policy.add(a)
    run_plan(policy, policy.schedule())
    b = Seq(1, 0.0, 3, 2)
    policy.add(b)
    for _ in range(4):
        plan = policy.schedule()
        assert shape(plan) == [(0, 1)]
        run_plan(policy, plan)
    assert policy.kv.used == 0 and list(policy.waiting) == [b]
    assert shape(policy.schedule()) == [(1, 3)]


def test_faster_transformer_extend_keeps_padded_kv_length() -> None:
    policy = FasterTransformer(ReservedKV(1000, 100), max_batch_size=4)
    a, b = make_seqs([(6, 10), (2, 4)])
    add(policy, a, b)
    run_plan(policy, policy.schedule())  # padded prefill to 6
    plan = policy.schedule()
    assert plan.decode_kv == 2 * 7
    extra = policy.extend(plan, 2)
    assert extra == 2
    for _ in range(1 + extra):
        run_plan(policy, plan)
    assert b.phase is Phase.FINISHED
    plan = policy.schedule()
    assert plan.decode_rows == 2 and plan.decode_kv == 2 * (7 + 3) and shape(plan) == [(0, 1)]


# ----------------------------------------------------------------------------------------------------------
# Orca
# ----------------------------------------------------------------------------------------------------------


def check_orca(policy: Orca, steps: list[Step]) -> None:
    kv = policy.kv
    assert isinstance(kv, ReservedKV)
    for st_ in steps:
        assert len(st_.rows) <= policy.max_batch_size
        n_old = len(st_.running_before)
        # every running request decodes in every iteration (Orca never preempts), then the newcomers
        assert st_.plan.seqs[:n_old] == st_.running_before
        assert all(not r.prefill and r.q == 1 for r in st_.rows[:n_old])
        new = st_.rows[n_old:]
        assert [r.seq for r in new] == st_.waiting_before[:len(new)]
        assert all(r.prefill and r.computed == 0 and r.q == r.seq.prompt_tokens for r in new)  # never chunked
        assert st_.running_after == st_.plan.seqs
        # greedy: admission stopped only for lack of a waiting request, batch room or a KV reservation, or at
        # the prefill cap
        cap = policy.settings.max_prefills
        assert not st_.admittable_after or (cap and len(new) == cap)
        assert not cap or len(new) <= cap
        assert st_.kv_used == kv.reserve_tokens * len(st_.running_after)  # a reservation per admitted seq
        assert st_.kv_used_end == kv.reserve_tokens * (len(st_.running_after) - len(st_.finished))


def test_orca_hybrid_batches_of_whole_prefills_and_decodes() -> None:
    kv = ReservedKV(300, 100)  # three reservations
    policy = Orca(kv, max_batch_size=16)
    a, b, c, d, e = make_seqs([(5, 4), (7, 3), (9, 2), (3, 2), (2, 1)])
    policy.add(a)
    plan = policy.schedule()
    assert shape(plan) == [(0, 5)] and kv.used == 100
    run_plan(policy, plan)
    policy.add(b)
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 7)]  # a decode and a whole prefill in one iteration
    assert plan.prefill_q == [7] and plan.decode_rows == 1 and plan.linear_tokens == 8
    run_plan(policy, plan)
    add(policy, c, d, e)
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 1), (2, 9)]  # d waits: no reservation left
    assert kv.used == 300 and list(policy.waiting) == [d, e]
    run_plan(policy, plan)  # c samples its 1st token
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 1), (2, 1)]
    run_plan(policy, plan)  # a samples its 4th token and b its 3rd, c its 2nd: all done
    assert kv.used == 0
    plan = policy.schedule()
    assert shape(plan) == [(3, 3), (4, 2)]


def test_orca_max_batch_size() -> None:
    policy = Orca(ReservedKV(100_000, 100), max_batch_size=2)
    seqs = make_seqs([(3, 5), (4, 5), (5, 5), (6, 5)])
    steps = drive(policy, seqs)
    check_orca(policy, steps)
    assert steps[0].ids == [0, 1]
    assert max(len(st_.rows) for st_ in steps) == 2


def test_orca_best_case_admits_one_whole_prompt_an_iteration() -> None:
    # SARATHI's best-case Orca (its Section 5.2): one new request's full prefill beside the ongoing decodes
    policy = Orca(ReservedKV(100_000, 100), max_batch_size=4, max_prefills=1)
    a, b, c = make_seqs([(5, 3), (7, 3), (9, 3)])
    add(policy, a, b, c)
    plan = policy.schedule()
    assert shape(plan) == [(0, 5)] and list(policy.waiting) == [b, c]
    run_plan(policy, plan)
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 7)]
    run_plan(policy, plan)
    assert shape(policy.schedule()) == [(0, 1), (1, 1), (2, 9)]


# ----------------------------------------------------------------------------------------------------------
# vLLM
# ----------------------------------------------------------------------------------------------------------


def check_vllm(policy: VLLM, steps: list[Step]) -> None:
    kv = policy.kv
    assert isinstance(kv, PagedKV)
    for st_ in steps:
        assert len(st_.rows) <= policy.max_batch_size
        # never mixed: all whole prefills or all decodes
        assert not (st_.has_prefill and st_.has_decode)
        if st_.head_admittable:  # prefill-first
            assert st_.has_prefill and st_.plan.seqs[0] is st_.waiting_before[0]
        if st_.has_prefill:
            assert all(r.q == r.remaining for r in st_.rows)  # never chunked
            assert st_.plan.seqs == st_.waiting_before[:len(st_.rows)]
            tokens = sum(r.q for r in st_.rows)
            assert len(st_.rows) == 1 or tokens <= policy.max_tokens
            assert st_.running_after == st_.running_before + st_.plan.seqs
            # the watermark holds right after admission
            assert kv.num_blocks - st_.kv_used // kv.block_size >= kv.watermark_blocks
            # greedy: stopped for an empty queue, batch size, KV, or the token limit
            if st_.admittable_after:
                assert tokens + st_.head_after_remaining > policy.max_tokens
        else:
            assert not st_.head_admittable
            # every running request decodes, except the newest ones preempted, which go back first in line
            n = len(st_.running_after)
            assert st_.running_after == st_.running_before[:n] == st_.plan.seqs
            assert st_.waiting_after == st_.requeued  # the preempted back in the queue


def test_vllm_never_mixes_and_prefills_first() -> None:
    policy = VLLM(big_paged(), max_tokens=8192)
    a, b, c = make_seqs([(20, 5), (30, 5), (10, 5)])
    policy.add(a)
    run_plan(policy, policy.schedule())
    plan = policy.schedule()
    assert shape(plan) == [(0, 1)]
    run_plan(policy, plan)
    add(policy, b, c)
    plan = policy.schedule()  # a stalls: a generation stall
    assert shape(plan) == [(1, 30), (2, 10)] and plan.decode_rows == 0
    run_plan(policy, plan)
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 1), (2, 1)]


def test_vllm_token_limit() -> None:
    policy = VLLM(big_paged(), max_tokens=32)
    seqs = make_seqs([(20, 2), (12, 2), (1, 2), (40, 2)])
    add(policy, *seqs)
    assert shape(policy.schedule()) == [(0, 20), (1, 12)]  # 32 tokens; the next would exceed
    policy2 = VLLM(big_paged(), max_tokens=32)
    s = Seq(0, 0.0, 40, 2)
    policy2.add(s)
    assert shape(policy2.schedule()) == [(0, 40)]  # an over-long prompt still runs, alone


def test_vllm_preempts_newest_by_recompute() -> None:
    kv = PagedKV(64, watermark=0.0)  # 4 blocks of 16
    policy = VLLM(kv, max_tokens=8192)
    a, b, c = make_seqs([(16, 40), (16, 40), (40, 3)])
    gaps = [0, 0, 1]  # c arrives after the first iteration, when it no longer fits
    steps = drive(policy, [a, b, c], gaps)
    check_vllm(policy, steps)
    assert steps[0].ids == [0, 1]
    pre = [i for i, st_ in enumerate(steps) if len(st_.running_after) < len(st_.running_before)
           and not st_.has_prefill]
    assert pre, "no preemption happened"
    first = steps[pre[0]]
    # a and b both reach 32 cached tokens at the 17th decode; a takes b's blocks
    assert pre[0] == 17 and first.ids == [0]
    assert first.waiting_after == [b, c]  # the victim is back at the head of the queue
    assert b.preemptions == 1 and a.preemptions == 0
    # b re-prefills its prompt and the 17 tokens it had generated, once a has finished
    redo = next(st_ for st_ in steps if 1 in st_.ids and st_.has_prefill and st_ is not steps[0])
    assert redo.rows[0].q == 16 + 17 and redo.ids == [1]
    assert steps.index(redo) > max(i for i, st_ in enumerate(steps) if 0 in st_.ids)
    assert a.generated == 40 and b.generated == 40 and c.generated == 3


def test_vllm_preemption_victim_can_be_the_asking_request() -> None:
    kv = PagedKV(48, watermark=0.0)  # 3 blocks
    policy = VLLM(kv, max_tokens=8192)
    a, b = make_seqs([(16, 20), (15, 20)])
    add(policy, a, b)
    run_plan(policy, policy.schedule())  # a: 1 block, b: 1 block
    plan = policy.schedule()  # a needs a 2nd block at 17 tokens; b still fits in its first
    assert shape(plan) == [(0, 1), (1, 1)] and kv.free_blocks == 0
    run_plan(policy, plan)
    plan = policy.schedule()  # a fits; b (16 -> 17 tokens) needs a block: b itself is the newest
    assert shape(plan) == [(0, 1)] and list(policy.waiting) == [b] and b.prefill_end == 15 + 2


def test_vllm_default_max_batch_and_watermark() -> None:
    policy = VLLM(big_paged(1 << 20), max_tokens=8192)
    assert policy.max_batch_size == 128
    seqs = make_seqs([(1, 2)] * 130)
    add(policy, *seqs)
    plan = policy.schedule()
    assert len(plan.seqs) == 128 and len(policy.waiting) == 2
    # watermark: 10 blocks, 2 kept back
    kv = PagedKV(160, watermark=0.2)
    policy = VLLM(kv, max_tokens=8192)
    a, b, c = make_seqs([(64, 3), (64, 3), (16, 3)])
    add(policy, a, b, c)
    plan = policy.schedule()
    assert shape(plan) == [(0, 64), (1, 64)] and kv.free_blocks == 2 == kv.watermark_blocks
    assert list(policy.waiting) == [c]


# ----------------------------------------------------------------------------------------------------------
# Sarathi-Serve and its ablations
# ----------------------------------------------------------------------------------------------------------


def split_rows(st_: Step) -> tuple[list[Row], list[Row], list[Row]]:
    """Decodes, ongoing prefill chunks (of requests already running), new admissions, in plan order."""
    before = {s.id for s in st_.running_before}
    decodes = [r for r in st_.rows if not r.prefill]
    ongoing = [r for r in st_.rows if r.prefill and r.seq.id in before]
    new = [r for r in st_.rows if r.prefill and r.seq.id not in before]
    return decodes, ongoing, new


def check_preempted(policy: Policy, st_: Step) -> list[Seq]:
    """Requests preempted by this schedule(): the newest running ones, back in the queue (first, in arrival
    order)."""
    kept = [s for s in st_.running_before if s in st_.running_after]
    victims = [s for s in st_.running_before if s not in st_.running_after]
    assert st_.running_before[:len(kept)] == kept
    assert st_.waiting_after == st_.requeued
    return victims


def check_sarathi(policy: SarathiServe, steps: list[Step]) -> None:
    budget = policy.token_budget
    for st_ in steps:
        assert len(st_.running_after) <= policy.max_batch_size
        decodes, ongoing, new = split_rows(st_)
        assert st_.rows == decodes + ongoing + new  # decodes, then ongoing chunks, then admissions
        victims = check_preempted(policy, st_)
        # stall-free: every running decode (unless preempted for KV) is in every iteration
        assert [r.seq for r in decodes] == [s for s in st_.decoding_before if s not in victims]
        assert [r.seq for r in new] == st_.waiting_before[:len(new)]
        assert not (victims and new)  # a step that preempted admits nobody (vLLM v1's rule)
        total = sum(r.q for r in st_.rows)
        if len(decodes) <= budget:
            assert total <= budget
        else:
            assert not ongoing and not new
        # chunk sizes: the largest piece that fits the leftover budget (Algorithm 3, get_next_chunk_size)
        used = len(decodes)
        for r in ongoing + new:
            assert r.q == min(r.remaining, budget - used)
            used += r.q
        if new:  # ongoing chunks go first: a newcomer only gets the budget they leave
            assert all(r.q == r.remaining for r in ongoing)
        capped = len(ongoing) + len(new) >= policy.max_prefills  # as many prompts as max_prefills allows
        # every partial prefill still running was offered the budget before any newcomer
        for s in st_.prefilling_before:
            if s not in victims and s not in [r.seq for r in ongoing]:
                assert used >= budget or capped
        # greedy admission: stopped for an empty queue, the budget, the prefill cap, batch size or KV (or a
        # preemption)
        assert victims or capped or not (used < budget and st_.admittable_after)
        # at most one partially prefilled request at a time
        assert len(st_.prefilling_before) <= 1


def test_sarathi_hand_computed_chunks() -> None:
    policy = SarathiServe(big_paged(), token_budget=8)
    a, b, c = make_seqs([(4, 10), (20, 10), (5, 10)])
    policy.add(a)
    plan = policy.schedule()
    assert shape(plan) == [(0, 4)]
    run_plan(policy, plan)
    add(policy, b, c)
    expected = [
        [(0, 1), (1, 7)],  # a's decode, then b takes the 7 tokens left
        [(0, 1), (1, 7)],  # b's ongoing chunk: 7 of its 13 left; c is not admitted
        [(0, 1), (1, 6), (2, 1)],  # b's last 6, then c gets the one token left
        [(0, 1), (1, 1), (2, 4)],  # b now decodes; c's ongoing chunk: its remaining 4
        [(0, 1), (1, 1), (2, 1)],
    ]
    for want in expected:
        plan = policy.schedule()
        assert shape(plan) == want
        assert sum(plan.num_new) <= 8
        run_plan(policy, plan)
    assert (a.generated, b.generated, c.generated) == (6, 3, 2)


def test_sarathi_decode_maximal_batches_take_one_chunk() -> None:
    # SARATHI's decode-maximal batching (max_prefills 1): the same trace as the hand case above, but a
    # prompt's last chunk is not topped up from the next prompt, and one prompt is chunked at a time
    policy = SarathiServe(big_paged(), token_budget=8, max_prefills=1)
    a, b, c = make_seqs([(4, 10), (20, 10), (5, 10)])
    policy.add(a)
    run_plan(policy, policy.schedule())
    add(policy, b, c)
    expected = [
        [(0, 1), (1, 7)],
        [(0, 1), (1, 7)],
        [(0, 1), (1, 6)],  # b's last 6: c waits although a token of the budget is left
        [(0, 1), (1, 1), (2, 5)],  # c's whole prompt, one chunk
        [(0, 1), (1, 1), (2, 1)],
    ]
    for want in expected:
        plan = policy.schedule()
        assert shape(plan) == want
        run_plan(policy, plan)


def test_sarathi_full_budget_of_decodes_admits_nothing() -> None:
    policy = SarathiServe(big_paged(), token_budget=2)
    a, b, c = make_seqs([(1, 3), (1, 5), (3, 5)])
    add(policy, a, b)
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 1)]
    run_plan(policy, plan)
    policy.add(c)
    for _ in range(2):  # two decodes fill the budget: c waits, the decodes never do
        plan = policy.schedule()
        assert shape(plan) == [(0, 1), (1, 1)]
        run_plan(policy, plan)
    assert a.phase is Phase.FINISHED
    assert shape(policy.schedule()) == [(1, 1), (2, 1)]


def test_chunked_only_takes_turns_with_the_decodes() -> None:
    # Table 4's chunked-prefills-only as the artifact's SimpleChunkingScheduler runs it: a prefill iteration
    # (the prompt mid-way first, new requests only when none is), then one of every running decode, and so on
    policy = ChunkedPrefillsOnly(big_paged(), token_budget=8)
    a, b, c = make_seqs([(4, 10), (20, 10), (5, 10)])
    policy.add(a)
    run_plan(policy, policy.schedule())  # a's whole prompt (4 of the 8), nothing else waits
    add(policy, b, c)
    expected = [[(0, 1)],  # the decodes' turn: a samples its second token
                [(1, 8)],  # b's first chunk takes the budget; c waits
                [(0, 1)],
                [(1, 8)],
                [(0, 1)],
                [(1, 4)],  # b's last chunk: c is not admitted beside a prompt mid-way
                [(0, 1), (1, 1)],
                [(2, 5)],
                [(0, 1), (1, 1), (2, 1)],
                [(0, 1), (1, 1), (2, 1)]]  # nothing to prefill: decodes run on
    for want in expected:
        plan = policy.schedule()
        assert shape(plan) == want
        run_plan(policy, plan)


def test_chunked_only_runs_chunks_back_to_back_only_without_decodes() -> None:
    alone = ChunkedPrefillsOnly(big_paged(), token_budget=8)
    alone.add(make_seqs([(30, 3)])[0])
    plan = alone.schedule()
    assert shape(plan) == [(0, 8)] and alone.chunk_repeats(plan) == 2  # chunks 8, 8, 8, then the last 6
    policy = ChunkedPrefillsOnly(big_paged(), token_budget=8)
    a, b = make_seqs([(30, 3), (2, 5)])
    policy.add(b)
    run_plan(policy, policy.schedule())
    policy.add(a)
    assert shape(policy.schedule()) == [(1, 1)]  # b's decode: its turn after b's prefill
    plan = policy.schedule()
    assert shape(plan) == [(0, 8)] and policy.chunk_repeats(plan) == 0  # b's decode takes the next turn
    run_plan(policy, plan)
    plan = policy.schedule()
    assert shape(plan) == [(1, 1)] and policy.extend(plan, 5) == 0  # and a's next chunk the one after


def check_chunked_only(policy: ChunkedPrefillsOnly, steps: list[Step]) -> None:
    budget = policy.token_budget
    after_prefill = False
    for st_ in steps:
        assert len(st_.running_after) <= policy.max_batch_size
        assert not (st_.has_prefill and st_.has_decode)
        victims = check_preempted(policy, st_)
        if st_.has_prefill:  # the prefills' turn: after the decodes' (or with none to run)
            assert not victims and not (after_prefill and st_.decoding_before)
            assert not (st_.extra and st_.decoding_before)  # chunks back to back only without decodes
            _, ongoing, new = split_rows(st_)
            assert st_.rows == ongoing + new and [r.seq for r in new] == st_.waiting_before[:len(new)]
            assert not (new and st_.prefilling_before)  # new requests only when no prompt is mid-way
            used = 0
            for r in st_.rows:  # chunked to the budget, ongoing prefills first
                assert r.q == min(r.remaining, budget - used)
                used += r.q
            assert used <= budget and len(st_.rows) <= policy.max_prefills
            assert not (new and used < budget and st_.admittable_after and len(new) < policy.max_prefills)
        else:
            # decodes: their turn after a prefill iteration, else only when no prefill could run
            assert after_prefill or not (st_.prefilling_before or st_.head_admittable)
            mid_prompt = [s for s in st_.prefilling_before if s not in victims]
            assert not (st_.extra and (mid_prompt or st_.admittable_after))  # repeats only with no prefill
            assert [r.seq for r in st_.rows] == [s for s in st_.decoding_before if s not in victims]
        after_prefill = st_.has_prefill


def check_vllm_v1(policy: VLLMV1, steps: list[Step]) -> None:
    """vLLM v1's step (vllm/v1/core/sched/scheduler.py): running requests first, in order, then waiting ones
    FCFS unless someone was preempted, each taking what it has left within the threshold and the budget."""
    kv, budget_of_step = policy.kv, policy.budget
    priority = policy.settings.admission == "priority"
    for st_ in steps:
        kept = [s for s in st_.running_before if s in st_.running_after]
        victims = [s for s in st_.running_before if s not in st_.running_after]
        if priority:  # the lowest priority first, then the latest arrival (vLLM's priority policy)
            rank = highest_priority_first
            assert all(rank(v) >= rank(k) for v in victims for k in kept)
            if victims:  # the pass may stop early, or reschedule at once: checked step by step against
                continue  # vLLM's own scheduler in tests/test_vllm_v1_vs_vllm.py
        assert kept == st_.running_before[:len(kept)]  # the victims are the last running ones
        eligible = len(st_.running_before) + len(st_.waiting_before)
        budget = budget_of_step
        # the plan lists decodes first: the scheduling order is the running order, then the waiting order
        old = sorted((r for r in st_.rows if r.seq in st_.running_before), key=lambda r: kept.index(r.seq))
        new = [r for r in st_.rows if r.seq not in st_.running_before]
        assert [r.seq for r in old] == kept[:len(old)]
        assert len(old) == len(kept) or budget_of_step == sum(r.q for r in old)  # stopped for the budget
        for r in old + new:
            left = r.remaining if r.prefill else 1
            if 0 < policy.threshold < left and eligible > 1:
                left = policy.threshold
            assert r.q == min(left, budget)
            budget -= r.q
        if victims:  # no admission in a step that preempted; the victims wait (first, in arrival order)
            assert not new and st_.waiting_after == st_.requeued
            continue
        assert [r.seq for r in new] == st_.waiting_before[:len(new)]
        assert st_.waiting_after == st_.waiting_before[len(new):]
        for r in new:  # a prefix hit is whole blocks, never the last known token
            assert r.computed % kv.block_size == 0 and r.computed < r.seq.prompt_tokens + r.seq.generated
            assert r.computed == 0 or kv.caching
        if st_.waiting_after and budget > 0 and len(st_.running_after) < policy.max_batch_size:
            assert not st_.admittable_after  # FCFS: admission stopped at a head whose blocks do not fit


# ----------------------------------------------------------------------------------------------------------
# each algorithm's rules on random workloads
# ----------------------------------------------------------------------------------------------------------

ALGORITHMS: dict[type[Policy], Callable] = {
    FasterTransformer: check_faster_transformer, HFPadded: check_faster_transformer,
    LengthOrdered: check_faster_transformer, Prepack: check_faster_transformer, Orca: check_orca,
    VLLM: check_vllm, VLLMV1: check_vllm_v1, SarathiServe: check_sarathi,
    HybridBatchingOnly: check_sarathi, ChunkedPrefillsOnly: check_chunked_only,  # hybrid: budget = max length
}


@pytest.mark.parametrize("cls", ALGORITHMS, ids=lambda c: c.name)
@settings(max_examples=100, deadline=None)
@given(data=st.data())
def test_algorithm_rules(cls: type[Policy], data: st.DataObject) -> None:
    case = data.draw(cases(cls.name, extend=data.draw(st.booleans())))
    ALGORITHMS[cls](case.policy, drive(case.policy, case.seqs, case.gaps, case.extend_cap))
