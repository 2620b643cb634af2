"""Baton (Cong et al., 2024, Sections 4.1-4.3) and its baselines, as the paper defines them: hand-computed
iterations of `baton`, `baton-pd` and `pd`, the cost both the simulator and the real engine see, and the
paper's query-set experiment shape."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simctl.costs.roofline import Roofline
from simctl.policies.baton import Baton, BatonPD
from simctl.policies.padded_kv import PaddedBatchKV
from simctl.policies.plan import BatchPlan, Layout, padded_prefill
from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq


def step(policy) -> BatchPlan | None:
    """One iteration as the replica loop runs it (no clock): schedule, advance, finish."""
    plan = policy.schedule()
    if plan is None:
        return None
    for s, q in zip(plan.seqs, plan.num_new):
        if s.advance(q) and s.generated == s.output_tokens:
            policy.finish(s)
    return plan


def baton(cls=Baton, capacity: int = 100_000, **options) -> Baton:
    return cls(PaddedBatchKV(capacity), **options)


def add(policy, *lengths: tuple[int, int]) -> list[Seq]:
    seqs = [Seq(i, 0.0, p, o) for i, (p, o) in enumerate(lengths)]
    for s in seqs:
        policy.add(s)
    return seqs


def test_a_finished_query_leaves_and_a_waiting_one_is_inserted_with_every_row_padded() -> None:
    policy = baton(max_batch_size=2)
    a, b, c = add(policy, (10, 2), (4, 5), (7, 3))
    first = step(policy)  # a and b: a padded prefill of 2 x 10 (the batch was empty)
    assert first.seqs == [a, b] and first.linear_tokens == 20 and policy.kv.width == 10
    assert policy.start == {a.id: 0, b.id: 6}  # b left-padded: the prompts end together
    step(policy)  # decode: a samples its 2nd and last token and leaves at once
    assert policy.running == [b] and policy.kv.used == 11  # one row of 11 columns
    # trim: b's KV starts at column 6 -> the 6 placeholder columns in front go; c is inserted:
    insert = step(policy)
    assert insert.seqs == [b, c] and insert.num_new == [1, 7]
    # B x l_new
    assert insert.layout is Layout.PADDED and insert.row_len == 7 and insert.linear_tokens == 2 * 7
    assert insert.prefill_q == [7, 7] and insert.prefill_c == [5, 5] and insert.dense_attention
    assert insert.kv_len == 5 + 7 and policy.kv.width == 12 and policy.kv.used == 24
    assert policy.start == {b.id: 0, c.id: 5}  # b's 6 pad columns stay inside its row; c behind placeholders
    assert (insert.prefill_tokens, insert.decode_tokens) == (7, 1)


def test_placeholders_are_trimmed_only_when_the_minimum_index_allows() -> None:
    policy = baton(max_batch_size=2)
    a, _b, c = add(policy, (3, 6), (8, 2), (5, 2))
    step(policy)  # prefill 2 x 8: a starts at 5, b at 0
    step(policy)  # b finishes (2 tokens): width 9
    assert policy.kv.width == 9 and policy.start == {a.id: 5}
    insert = step(policy)  # trim a's 5 placeholder columns (it is the only row), then insert c (5 tokens)
    assert insert.prefill_c == [4, 4] and policy.kv.width == 4 + 5 and policy.start == {a.id: 0, c.id: 4}
    step(policy)  # c's 2nd token: c leaves; a holds columns 0.. (min index 0): nothing can be trimmed
    assert policy.running == [a] and policy.kv.width == 10
    step(policy)
    assert policy.kv.width == 11  # a's row keeps its padding: only the columns in front are placeholders


def test_pd_decoupling_processes_one_token_per_query_and_embeds_end_aligned() -> None:
    policy = baton(BatonPD, max_batch_size=2)
    a, b, c = add(policy, (10, 2), (4, 6), (30, 2))
    first = step(policy)  # prefilled apart: a padded prefill of the newcomers only
    assert first.seqs == [a, b] and first.row_len == 10 and policy.start == {a.id: 0, b.id: 6}
    step(policy)  # a leaves
    prefill = step(policy)  # c (30 tokens) is prefilled apart: the batch waits, b does not compute
    assert prefill.seqs == [c] and prefill.linear_tokens == 30 and prefill.num_new == [30]
    # embedding c's 30 columns widens the batch on the left (b held 11 columns; its 6 in front were trimmed)
    assert policy.kv.width == 30 and policy.start == {b.id: 25, c.id: 0}
    while policy.running:
        plan = step(policy)
        assert plan.decode_only and plan.num_new == [1] * len(plan.seqs) and plan.row_len == 1
    assert policy.kv.used == 0 and policy.idle


def test_pd_decoupling_never_pads_a_running_query() -> None:
    """Same queries: baton pads every running row to each newcomer's prompt; baton-pd computes one token per
    query in every batched iteration, and its prefills hold newcomers only."""
    lengths = [(50, 3), (5, 40), (200, 4), (9, 30), (120, 2)]
    tokens = {}
    for cls in (Baton, BatonPD):
        policy = baton(cls, max_batch_size=2)
        add(policy, *lengths)
        total = 0
        while not policy.idle:
            plan = policy.schedule()
            if cls is BatonPD:
                assert all(s.in_prefill for s in plan.seqs) or (
                    plan.decode_only and plan.linear_tokens == len(plan.seqs) == plan.decode_tokens)
            elif not plan.decode_only:
                assert plan.linear_tokens == len(plan.seqs) * plan.row_len
            for s, q in zip(plan.seqs, plan.num_new):
                if s.advance(q) and s.generated == s.output_tokens:
                    policy.finish(s)
            total += plan.linear_tokens
        tokens[cls.name] = total
    assert tokens["baton"] > tokens["baton-pd"]


def test_batch_size_scaling_moves_the_newest_query_to_host_and_embeds_it_back() -> None:
    # capacity 100 with a threshold of 50%: two rows may hold 25 columns each at most
    policy = baton(capacity=100, max_batch_size=2, kv_threshold=50)
    x, y = add(policy, (20, 30), (20, 30))
    step(policy)
    widths = []
    while len(policy.running) == 2:
        step(policy)
        widths.append(policy.kv.width)
    assert widths == [21, 22, 23, 24, 25, 26] and policy.running == [x]  # y moved out before 2 x 26 > 50
    assert list(policy.arrived_with_kv) == [y] and y.computed == 25  # its KV kept (on the host)
    while y in policy.arrived_with_kv:  # it fits back only once x is done (2 rows of >= 27 > 50)
        step(policy)
    # embedded (25 columns, no recompute) and decoded in the same step
    assert x.generated == 30 and policy.running == [y] and policy.kv.width == 26
    news = []
    while not policy.idle:
        plan = step(policy)
        news += [q for s, q in zip(plan.seqs, plan.num_new) if s is y]
    assert set(news) == {1} and y.preemptions == 0 and y.generated == 30 and policy.kv.used == 0


def test_a_lone_row_whose_padding_fills_the_cache_is_compacted() -> None:
    policy = baton(capacity=60, max_batch_size=2)
    (a,) = add(policy, (2, 50))
    step(policy)
    b = Seq(1, 0.0, 20, 1)
    policy.add(b)
    step(policy)  # b is inserted (a padded to 20 tokens: 19 pad columns inside a's row) and leaves at once
    assert policy.running == [a] and policy.kv.width == 22 and a.computed == 3
    widths = []
    while not policy.idle:
        step(policy)
        widths.append(policy.kv.width)
        assert policy.kv.used <= 60
    # a's KV with its padding reached the whole cache: re-embedded compactly (its own 41 columns), then grew
    assert 60 in widths and widths[widths.index(60) + 1] == 42
    assert a.generated == 50


def test_pd_prefills_similar_lengths_apart_then_decodes_the_batch_out() -> None:
    policy = make_policy("pd", 100_000, 512, {"max_batch_size": 4, "prefill_batch_size": 2})
    seqs = add(policy, (40, 3), (5, 6), (30, 2), (8, 2))
    prefills = [step(policy), step(policy)]
    assert [[s.id for s in p.seqs] for p in prefills] == [[1, 3], [2, 0]]  # by length: (5, 8), (30, 40)
    assert [p.row_len for p in prefills] == [8, 40] and all(p.batch_rows == 4 for p in prefills)
    decode = step(policy)
    assert decode.rows == 4 and decode.kv_len == 41  # combined: KV end-aligned to the longest prompt
    while not policy.idle:
        assert step(policy).rows == 4  # finished rows stay until the batch ends (early return of results)
    assert all(s.generated == s.output_tokens for s in seqs)


def test_the_cost_model_prices_b_times_l_new_tokens_and_dense_attention() -> None:
    policy = baton(max_batch_size=3)
    add(policy, (100, 50), (100, 2), (100, 50), (400, 5))
    step(policy)
    step(policy)  # the 2nd query leaves
    insert = step(policy)  # 400 tokens inserted: 3 rows x 400
    assert insert.linear_tokens == 3 * 400
    roof = Roofline("llama-2-7b", "a6000")
    # two rows computing the prompt already cost less than the insertion, whose three rows all compute 400
    two = padded_prefill([Seq(98, 0.0, 400, 2), Seq(99, 0.0, 400, 2)], dense=True)
    assert roof.iteration_time(insert) > roof.iteration_time(two)
    assert insert.prefill_q == [400] * 3 and insert.prefill_c == [101] * 3 and insert.dense_attention


@pytest.mark.parametrize("name", ["baton", "baton-pd", "pd"])
def test_bad_options_are_one_line_errors(name: str) -> None:
    from simctl.common.errors import InputError

    with pytest.raises(InputError, match="--max-batch-size must be an integer from 1 to"):
        make_policy(name, 10_000, 512, {"max_batch_size": 0})


@pytest.mark.parametrize("early_return", [0, 1])
def test_hf_padded_returns_a_batch_at_its_end_unless_early_return(early_return: int) -> None:
    from conftest import AffineCost

    from simctl.sim.simulate import simulate
    from simctl.traces.request import Request

    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(30, 3), (10, 9), (20, 5), (5, 2)])]
    policy = make_policy("hf-padded", 10_000, 64, {"max_batch_size": 2, "early_return": early_return})
    done = simulate(requests, policy, AffineCost()).requests
    first_batch = done["completion_s"][:2].tolist()
    if early_return:
        assert first_batch[0] < first_batch[1]  # the 3-token request returns before the 9-token one
    else:
        assert first_batch[0] == first_batch[1]  # both when the batch ends
    assert done["first_token_s"][0] == done["first_token_s"][1] < first_batch[0]  # tokens keep their times
    with pytest.raises(Exception, match="--early-return must be an integer from 0 to 1"):
        make_policy("hf-padded", 10_000, 64, {"early_return": 2})


@pytest.mark.parametrize("cls", [Baton, BatonPD])
def test_preemption_gives_a_higher_priority_query_the_lowest_priority_row(cls) -> None:
    policy = baton(cls, max_batch_size=2, preempt=1)
    a, b = add(policy, (10, 20), (10, 20))
    a.priority = 1  # b is the lowest-priority running query
    step(policy)
    step(policy)
    c = Seq(2, 0.0, 6, 3, priority=5)
    same = Seq(3, 0.0, 6, 3, priority=1)  # as high as a: it cannot displace a, but it outranks b
    policy.add(same)
    policy.add(c)
    plan = step(policy)  # c (the highest) displaces b (the lowest running), not a
    assert c in plan.seqs and policy.running == [a, c] and list(policy.arrived_with_kv) == [b]
    assert b.computed == 11 and b.preemptions == 0  # its KV moved to host, kept
    while c in policy.running:
        step(policy)
    step(policy)  # c finished: b comes back, but `same` outranks it and takes the row
    assert policy.running == [a, same] and list(policy.arrived_with_kv) == [b]
    news = []
    while not policy.idle:
        plan = step(policy)
        news += [q for s, q in zip(plan.seqs, plan.num_new) if s is b]
    assert set(news) == {1}  # b came back embedded, never prefilled again
    while not policy.idle:
        step(policy)
    assert all(s.generated == s.output_tokens for s in (a, b, c, same)) and policy.kv.used == 0


def test_no_preemption_without_the_option_or_a_higher_priority() -> None:
    for preempt, priority in ((0, 9), (1, 0)):
        policy = baton(max_batch_size=2, preempt=preempt)
        a, b = add(policy, (10, 20), (10, 20))
        step(policy)
        policy.add(Seq(2, 0.0, 6, 3, priority=priority))
        plan = step(policy)
        assert plan.decode_only and policy.running == [a, b] and not policy.arrived_with_kv


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(st.tuples(st.floats(0, 0.3), st.integers(1, 200), st.integers(1, 60), st.integers(0, 3)),
                     min_size=1, max_size=25),
       name=st.sampled_from(["baton", "baton-pd"]), batch=st.integers(1, 5), threshold=st.integers(30, 100),
       spare=st.integers(0, 600))
def test_preemption_and_scaling_keep_every_invariant(reqs, name, batch, threshold, spare) -> None:
    from conftest import AffineCost

    from simctl.sim.simulate import simulate
    from simctl.traces.request import Request

    t, requests = 0.0, []
    for i, (gap, p, o, prio) in enumerate(reqs):
        t += gap
        requests.append(Request(i, t, p, o, prio))
    capacity = max(p + o for _, p, o, _ in reqs) + spare
    policy = make_policy(name, capacity, capacity, {"max_batch_size": batch, "kv_threshold": threshold,
                                                    "preempt": 1})
    res = simulate(requests, policy, AffineCost())
    done = res.requests
    assert (done["generated_tokens"] == done["output_tokens"]).all() and (done["completion_s"] >= 0).all()
    assert (done["preemptions"] == 0).all()  # moved to host, never recomputed
    its = res.iterations.frame()
    assert its["kv_used_tokens"].max() <= capacity and policy.kv.used == 0 and policy.idle
    processed = int((its["count"] * its["decode_tokens"]).sum() + its["prefill_tokens"].sum())
    assert processed == int(done["prompt_tokens"].sum() + (done["output_tokens"] - 1).sum())


def test_overlap_prefills_the_next_query_beside_the_decodes_and_embeds_it_when_a_row_frees() -> None:
    """--overlap 1 (the paper's asynchronous P&D decoupling): an empty batch is prefilled on its own; then the
    next waiting query is prefilled chunk by chunk beside each decode step (a second stream), held with its
    KV, and embedded end-aligned as soon as a row is free; the batch never stops for a prefill."""
    policy = baton(BatonPD, max_batch_size=2, overlap=1, overlap_chunk=8)
    a, b, c = add(policy, (10, 2), (4, 6), (20, 3))
    first = step(policy)
    assert first.seqs == [a, b] and not first.streams
    second = step(policy)  # a and b decode; c's first 8 tokens beside them; a finishes
    decode, prefill = second.streams
    assert decode.decode_only and decode.seqs == [a, b] and prefill.seqs == [c]
    assert second.seqs == [a, b, c] and second.num_new == [1, 1, 8] and second.decode_tokens == 2
    assert (prefill.prefill_q, prefill.prefill_c) == ([8], [0]) and not second.decode_only
    third = step(policy)  # a's row is free, but c is not prefilled yet: b decodes on, c's next chunk beside
    assert third.seqs == [b, c] and third.num_new == [1, 8] and third.prefill_c == [8]
    fourth = step(policy)  # c's last 4 tokens: it samples its first token
    assert fourth.num_new == [1, 4] and c.generated == 1 and not c.in_prefill
    fifth = step(policy)  # c embedded end-aligned (20 columns, wider than b's 7): both decode, one token each
    assert fifth.decode_only and fifth.seqs == [b, c] and not fifth.streams
    assert policy.start == {b.id: 13, c.id: 0} and policy.kv.width == 21
    while not policy.idle:
        step(policy)
    assert all(s.generated == s.output_tokens for s in (a, b, c)) and policy.kv.used == 0


def test_overlap_refuses_preemption() -> None:
    from simctl.common.errors import InputError

    with pytest.raises(InputError, match="--overlap 1 .* cannot take --preempt 1"):
        make_policy("baton-pd", 10_000, 512, {"overlap": 1, "preempt": 1, "admission": "priority"})


def test_concurrent_streams_add_their_demands_in_one_roofline() -> None:
    """A decode beside a prefill chunk, by hand from the A6000's specs: per kind of kernel the two streams'
    FLOPs and bytes add before the sqrt blend (each stream reads the weights), the GEMM ramps once, the host
    terms twice; the result lies between the longer stream and the two run in turn."""
    import math

    from simctl.policies.plan import concurrent, hybrid, padded_decode

    roof = Roofline("llama-2-7b", "a6000")
    running = [Seq(i, 0.0, 300, 50) for i in range(4)]
    for s in running:
        s.advance(300)
    newcomer = Seq(9, 0.0, 1000, 10)
    decode, chunk = padded_decode(running, rows=4, kv_len=301), hybrid([], [newcomer], [512])
    plan = concurrent(decode, chunk)
    flops, bw = roof.gpu.peak_flops * roof.mfu, roof.gpu.mem_bandwidth * roof.mbu
    lin, lm = roof.linear_params_per_gpu, roof.lm_head_params_per_gpu
    linear = math.hypot(2 * lin * (4 + 512) / flops, 2 * lin * 2 / bw)
    lm_head = math.hypot(2 * lm * 4 / flops, lm * 2 / bw)  # the chunk stops short of its prompt: no sample
    pa_c, pa_m, dkv = roof.attention_rates()
    attention = math.hypot(pa_c * 512 * 256, pa_m * 512 + dkv * 4 * 301)
    gemms = 4 * roof.model.num_layers * roof.gemm_latency_s + roof.gemm_latency_s
    host = 2 * roof.overhead_s + 5 * roof.steps.request_s  # a step each stream, 5 requests
    expected = linear + lm_head + attention + gemms + host
    assert roof.iteration_time(plan) == pytest.approx(expected, rel=1e-12)
    alone = [roof.iteration_time(decode), roof.iteration_time(chunk)]
    assert max(alone) < roof.iteration_time(plan) < sum(alone)


def test_eager_streams_pay_both_launch_floors() -> None:
    from simctl.policies.plan import concurrent, hybrid, padded_decode

    roof = Roofline("llama-2-7b", "h100", execution="eager")  # two weight reads well under two floors
    s, newcomer = Seq(0, 0.0, 4, 5), Seq(1, 0.0, 4, 5)
    s.advance(4)
    plan = concurrent(padded_decode([s], rows=1, kv_len=5), hybrid([], [newcomer], [4]))
    host = 2 * roof.overhead_s + 2 * roof.steps.request_s  # a step and a request each stream
    assert roof.iteration_time(plan) == pytest.approx(2 * roof.steps.launch_floor_s + host)
