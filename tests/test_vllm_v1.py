"""vllm-v1: vLLM v1's scheduler (vllm/v1/core/sched/scheduler.py) and block pool with prefix caching
(vllm/v1/core/block_pool.py, kv_cache_manager.py), step by step on hand-computed cases; its device defaults;
prefix_group / prefix_tokens in trace files; prefix-cache statistics in a run's summary."""

from __future__ import annotations

from pathlib import Path

import pytest
from policy_cases import drive, run_plan, shape

from simctl.common.errors import InputError
from simctl.policies.registry import make_policy
from simctl.policies.seq import Phase, Seq
from simctl.policies.vllm_v1 import VLLMV1
from simctl.sim.run import RunConfig, run
from simctl.traces.build import build_trace
from simctl.traces.request import Request
from simctl.traces.workload import Workload


def v1(blocks: int, block: int = 4, caching: int = 0, **options: int) -> VLLMV1:
    policy = make_policy("vllm-v1", blocks * block, 4096,
                         {"block_size": block, "enable_prefix_caching": caching, **options})
    assert isinstance(policy, VLLMV1)
    return policy


def seq(i: int, prompt: int, output: int, group: int = -1, shared: int = 0) -> Seq:
    return Seq(i, float(i), prompt, output, prefix_group=group, prefix_tokens=shared)


def test_one_budget_running_first_then_waiting_chunked() -> None:
    policy = v1(100, max_num_batched_tokens=10, max_batch_size=4)
    a, b, c = seq(0, 6, 3), seq(1, 12, 2), seq(2, 5, 2)
    for s in (a, b, c):
        policy.add(s)
    plan = policy.schedule()  # A whole (6), B chunked to the 4 left; no budget for C
    assert shape(plan) == [(0, 6), (1, 4)] and list(policy.waiting) == [c]
    run_plan(policy, plan)
    plan = policy.schedule()  # A's decode, B's last 8 prompt tokens, then C's first token (budget 10)
    assert shape(plan) == [(0, 1), (1, 8), (2, 1)] and plan.prefill_c == [4, 0]
    run_plan(policy, plan)
    plan = policy.schedule()  # decodes of A and B, C's remaining 4 prompt tokens
    assert shape(plan) == [(0, 1), (1, 1), (2, 4)]
    run_plan(policy, plan)
    assert a.phase is b.phase is Phase.FINISHED
    assert shape(policy.schedule()) == [(2, 1)]


def test_long_prefill_threshold_only_when_others_run_or_wait() -> None:
    policy = v1(100, long_prefill_token_threshold=3)
    policy.add(seq(0, 8, 2))
    assert shape(policy.schedule()) == [(0, 8)]  # alone: nobody to starve, the whole prompt
    policy = v1(100, long_prefill_token_threshold=3)
    a, b = seq(0, 8, 2), seq(1, 2, 2)
    policy.add(a)
    policy.add(b)
    plan = policy.schedule()
    assert shape(plan) == [(0, 3), (1, 2)]
    run_plan(policy, plan)
    assert shape(policy.schedule()) == [(1, 1), (0, 3)]  # decodes listed first; A's next 3 tokens


def test_preempts_the_last_running_and_requeues_it_first() -> None:
    policy = v1(4)  # 4 blocks of 4 tokens
    a, b, c = seq(0, 4, 10), seq(1, 4, 10), seq(2, 4, 10)
    for s in (a, b, c):
        policy.add(s)
    plan = policy.schedule()  # one block each for the 4-token prompts; 1 block left
    assert shape(plan) == [(0, 4), (1, 4), (2, 4)] and policy.kv.free_blocks == 1
    run_plan(policy, plan)
    plan = policy.schedule()  # A takes the free block; B needs one: C, the last running, is preempted
    assert shape(plan) == [(0, 1), (1, 1)] and list(policy.waiting) == [c]
    assert c.computed == 0 and c.prefill_end == 5 and c.preemptions == 1
    run_plan(policy, plan)
    for _ in range(3):  # A and B fill their second block; C (2 blocks) does not fit: admission blocked
        plan = policy.schedule()
        assert shape(plan) == [(0, 1), (1, 1)]
        run_plan(policy, plan)
    plan = policy.schedule()  # A's 9th token needs a third block: B is preempted, and waits before C
    assert shape(plan) == [(0, 1)] and list(policy.waiting) == [b, c] and b.prefill_end == 9


def test_priority_preempts_the_lowest_priority_and_gives_back_its_scheduled_tokens() -> None:
    policy = make_policy("vllm-v1", 4 * 4, 4096, {"block_size": 4, "admission": "priority"})
    a, b, c = Seq(0, 0.0, 4, 10, 0), Seq(1, 1.0, 4, 10, 2), Seq(2, 2.0, 4, 10, 1)
    policy.add(a)
    run_plan(policy, policy.schedule())  # A alone: 1 block
    policy.add(c)
    policy.add(b)
    plan = policy.schedule()  # A's decode takes a 2nd block; B then C (by priority) one each: none free
    assert shape(plan) == [(0, 1), (1, 4), (2, 4)] and policy.kv.free_blocks == 0
    run_plan(policy, plan)
    # A fits in its blocks and is scheduled; B needs a block: A, the lowest priority though admitted first,
    # is preempted and its token given back; C takes A's freed block (FCFS would have preempted C)
    plan = policy.schedule()
    assert shape(plan) == [(1, 1), (2, 1)] and list(policy.waiting) == [a] and a.preemptions == 1
    assert policy.running == [b, c] and policy.kv.free_blocks == 0


def test_the_request_asking_may_preempt_itself() -> None:
    policy = v1(3)
    a, b, c = seq(0, 5, 7), seq(1, 4, 8), seq(2, 1, 1)  # each fits the 3 blocks alone
    policy.add(a)
    policy.add(b)
    run_plan(policy, policy.schedule())  # A: 2 blocks, B: 1, none free
    policy.add(c)
    plan = policy.schedule()  # A fits in its blocks; B (the last) needs a block: it preempts itself
    assert shape(plan) == [(0, 1)] and list(policy.waiting) == [b, c]  # and nobody is admitted this step
    assert policy.running == [a] and b.prefill_end == 5


def test_admission_needs_the_whole_sequence_and_is_fcfs() -> None:
    policy = v1(5, max_num_batched_tokens=8, max_batch_size=4)
    a, b, c = seq(0, 12, 2), seq(1, 9, 2), seq(2, 1, 2)
    for s in (a, b, c):
        policy.add(s)
    plan = policy.schedule()  # a chunk of 8 (2 blocks), admitted as its 3 blocks fit
    assert shape(plan) == [(0, 8)] and policy.kv.free_blocks == 3
    run_plan(policy, plan)
    plan = policy.schedule()  # A's last 4 tokens (its 3rd block); B's chunk of 4 would need 1 block, but its
    # whole 9 tokens need 3 and 2 are free; C, which fits, waits behind it
    assert shape(plan) == [(0, 4)] and list(policy.waiting) == [b, c] and policy.kv.free_blocks == 2


def test_prefix_hits_whole_blocks_never_the_last_token() -> None:
    policy = v1(100, caching=1)
    first, hit, whole = seq(0, 10, 1, 0, 8), seq(1, 9, 1, 0, 8), seq(2, 8, 1, 0, 8)
    policy.add(first)
    run_plan(policy, policy.schedule())  # 10 tokens: blocks (0, 0) and (0, 1) cached, the third partial
    policy.add(hit)
    plan = policy.schedule()
    assert shape(plan) == [(1, 1)] and plan.prefill_c == [8]  # 8 tokens hit: one left to compute
    run_plan(policy, plan)
    policy.add(whole)
    plan = policy.schedule()  # its whole prompt is cached, but its last block is computed again
    assert shape(plan) == [(2, 4)] and plan.prefill_c == [4]
    run_plan(policy, plan)
    assert policy.stats() == {"prefix_cache_hits": 12, "prefix_cache_queries": 27,
                              "prefix_cache_preempted_hits": 0,
                              "prefix_cache_preempted_queries": 0}
    assert VLLMV1.summarise_stats(policy.stats())["prefix_cache_hit_rate"] == 12 / 27
    assert policy.kv.used == 0  # cached blocks are free


def test_other_groups_and_own_tokens_never_hit() -> None:
    policy = v1(100, caching=1)
    for i, (group, shared) in enumerate([(0, 8), (1, 8), (-1, 0), (0, 4)]):
        policy.add(seq(i, 12, 1, group, shared))
    plan = policy.schedule()
    # all admitted in one step: the first caches (0, 0..1) at allocation, before the others look up; the
    # last shares only its first block with it
    assert plan.prefill_c == [0, 0, 0, 4]


def test_cached_blocks_are_evicted_tail_first_least_recent_first() -> None:
    policy = v1(4, caching=1)  # 4 blocks of 4
    policy.add(seq(0, 10, 1, 0, 8))
    run_plan(policy, policy.schedule())  # freed: the partial block is plain, (0, 1) then (0, 0) evictable
    assert len(policy.kv.plain) == 2 and len(policy.kv.evictable) == 2
    policy.add(seq(1, 12, 1))  # 3 new blocks: 2 plain, then the least recent cached one, (0, 1)
    run_plan(policy, policy.schedule())
    late = seq(2, 9, 1, 0, 8)
    policy.add(late)
    plan = policy.schedule()
    assert plan.prefill_c == [4]  # (0, 0) survived, (0, 1) was evicted


def test_a_preempted_request_hits_its_own_cached_blocks() -> None:
    policy = v1(4, caching=1)
    a, b = seq(0, 8, 4), seq(1, 4, 10)  # A never needs more than 3 blocks
    policy.add(a)
    policy.add(b)
    run_plan(policy, policy.schedule())  # A: 2 blocks, B: 1, one free
    plan = policy.schedule()  # A takes the free block; B preempts itself, its full first block stays cached
    assert shape(plan) == [(0, 1)] and list(policy.waiting) == [b]
    run_plan(policy, plan)
    while a.phase is not Phase.FINISHED:  # B (2 blocks, 1 of them its cached one) does not fit meanwhile
        run_plan(policy, policy.schedule())
    plan = policy.schedule()  # B back: 5 known tokens, its first block (4 tokens) hit
    assert shape(plan) == [(1, 1)] and plan.prefill_c == [4]
    assert policy.stats()["prefix_cache_preempted_hits"] == 4
    assert policy.stats()["prefix_cache_preempted_queries"] == 5


def test_decode_stretches_match_stepping_with_cached_blocks() -> None:
    def run_all(extend_cap: int) -> list[list[tuple[int, int]]]:
        seqs = [seq(i, 7 + 3 * i, 30 - 2 * i, i % 2, 6) for i in range(6)]
        steps = drive(v1(14, caching=1, max_batch_size=3), seqs, [0, 0, 0, 5, 9, 2], extend_cap)
        return [[(r.seq.id, r.q) for r in st.rows] for st in steps for _ in range(1 + st.extra)]

    assert run_all(40) == run_all(0)


@pytest.mark.parametrize(("gpu", "expected"), [
    (None, (2048, 256, 16)), ("a100-80gb", (2048, 256, 16)), ("h100", (8192, 1024, 16)),
    ("h200", (8192, 1024, 16)), ("cpu", (2048, 128, 128))])
def test_defaults_are_vllm_s_for_the_device(gpu: str | None, expected: tuple[int, int, int]) -> None:
    s = make_policy("vllm-v1", 1 << 20, 2048, gpu=gpu).settings
    assert (s.max_num_batched_tokens, s.max_batch_size, s.block_size) == expected
    assert (s.enable_prefix_caching, s.long_prefill_token_threshold) == (1, 0)
    given = make_policy("vllm-v1", 1 << 20, 2048, {"block_size": 32, "max_batch_size": 8}, gpu=gpu).settings
    assert (given.block_size, given.max_batch_size) == (32, 8)  # what the user gives wins


def test_bad_settings_are_one_line() -> None:
    with pytest.raises(InputError, match="--max-num-batched-tokens .* must be at least"):
        make_policy("vllm-v1", 1 << 20, 2048, {"max_num_batched_tokens": 100})
    with pytest.raises(InputError, match="--enable-prefix-caching must be an integer from 0 to 1"):
        make_policy("vllm-v1", 1 << 20, 2048, {"enable_prefix_caching": 2})
    with pytest.raises(InputError, match="--block-size must be an integer from 1 to"):
        make_policy("vllm-v1", 1 << 20, 2048, {"block_size": 0})
    cpu = make_policy("vllm-v1", 1000, 2048, gpu="cpu")  # 7 blocks of 128
    assert cpu.max_admissible_tokens(1000, 2048) == 992  # what blocks of the default 16 hold
    cpu.add(seq(0, 900, 51))
    with pytest.raises(InputError, match="request 0 needs 8 KV blocks of 128 tokens but the cache has 7"):
        cpu.schedule()


def test_prefix_columns_of_trace_files(tmp_path: Path) -> None:
    csv = tmp_path / "t.csv"
    csv.write_text("num_prefill_tokens,num_decode_tokens,prefix_group,prefix_tokens\n100,5,0,64\n80,3,0,64\n"
                   "50,2,-1,0\n")
    reqs = build_trace(str(csv), None, 1.0, 0)
    assert [(r.prefix_group, r.prefix_tokens) for r in reqs] == [(0, 64), (0, 64), (-1, 0)]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"prompt_tokens": 10, "output_tokens": 2, "prefix_group": 3, "prefix_tokens": 8}\n'
                     '{"prompt_tokens": 10, "output_tokens": 2}\n')
    reqs = build_trace(str(jsonl), None, 1.0, 0, scale=2.0)  # the prefix scales with its prompt
    assert [(r.prompt_tokens, r.prefix_group, r.prefix_tokens) for r in reqs] == [(20, 3, 16), (20, -1, 0)]
    for body, match in [("10,5,0,11", "prefix_tokens is 11, expected an integer from 0 to the prompt's 10"),
                        ("10,5,-2,4", "prefix_group is -2, expected an integer >= -1"),
                        ("10,5,0.5,4", "prefix_group is 0.5"), ("10,5,0,", "prefix_tokens is empty")]:
        csv.write_text(f"num_prefill_tokens,num_decode_tokens,prefix_group,prefix_tokens\n{body}\n")
        with pytest.raises(InputError, match=f"line 2: {match}"):
            build_trace(str(csv), None, 1.0, 0)


def test_summary_reports_prefix_caching_only_where_there_is_some(tmp_path: Path) -> None:
    trace = tmp_path / "shared.jsonl"
    trace.write_text("".join(f'{{"prompt_tokens": 600, "output_tokens": 20, "prefix_group": 0, '
                             f'"prefix_tokens": 512, "arrival_s": {0.5 * i}}}\n' for i in range(8)))
    config = RunConfig(policy="vllm-v1", workload=Workload(trace=str(trace), qps=None, num_requests=8),
                       model="tiny")
    summary = run(config).summary
    # the first request misses; the 7 others hit the 512 shared tokens (32 blocks of 16)
    assert summary["prefix_cache_hits"] == 7 * 512 and summary["prefix_cache_queries"] == 8 * 600
    assert summary["prefix_cache_hit_rate"] == 7 * 512 / (8 * 600)
    for policy, options in [("vllm-v1", {"enable_prefix_caching": 0}), ("vllm", {})]:
        other = run(RunConfig(policy=policy, workload=Workload(trace=str(trace), qps=None, num_requests=8),
                              model="tiny", options=options)).summary
        assert not [k for k in other if k.startswith("prefix_cache")]
    cpu = run(RunConfig(policy="vllm-v1", workload=Workload(trace=str(trace), qps=None, num_requests=8),
                        model="tiny", gpu="cpu"))
    assert (cpu.summary["block_size"], cpu.summary["max_num_batched_tokens"]) == (128, 2048)
    assert cpu.summary["prefix_cache_hits"] == 7 * 512  # 4 blocks of 128


def test_a_victim_may_come_back_at_once_so_its_step_does_not_repeat() -> None:
    # A and B, admitted together a token a step, each compute block (0, 0) of their group: the cache holds
    # both, A's first. When B preempts itself, its lookup takes A's copy, so B needs one block fewer than it
    # freed and comes back at once: the decode plan of the step that preempted must not be stretched
    policy = v1(11, caching=1, max_batch_size=2, long_prefill_token_threshold=1)
    a, b = seq(0, 15, 16, 0, 14), seq(1, 11, 19, 0, 7)
    policy.add(a)
    policy.add(b)
    plan = policy.schedule()
    while b.phase is Phase.RUNNING:
        run_plan(policy, plan)
        plan = policy.schedule()
    assert shape(plan) == [(0, 1)] and policy.preempted and b.known_tokens == 21
    assert policy.extend(plan, 5) == policy.repeats_allowed(plan, 5) == 0
    run_plan(policy, plan)
    plan = policy.schedule()
    assert shape(plan) == [(0, 1), (1, 1)] and plan.prefill_c == [20]  # 20 of B's 21 tokens hit


def test_simctl_s_own_engine_refuses_shared_prefixes_it_cannot_share() -> None:
    from simctl.catalogue.models import get_model
    from simctl.engine.setup import RealConfig, size_run

    requests = [Request(i, 0.0, 40, 4, prefix_group=0, prefix_tokens=32) for i in range(3)]
    per_token = get_model("tiny").kv_bytes_per_token(4)
    config = RealConfig(policy="vllm-v1", model="tiny")
    with pytest.raises(InputError, match="vllm-v1 reuses cached prompt prefixes across requests"):
        size_run(config, requests, per_token, 1 << 30)
    size_run(RealConfig(policy="vllm-v1", model="tiny", options={"enable_prefix_caching": 0}), requests,
             per_token, 1 << 30)
    size_run(config, [Request(0, 0.0, 40, 4)], per_token, 1 << 30)  # no shared prefix: nothing to refuse
