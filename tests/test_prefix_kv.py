"""vLLM v1's prefix cache (simctl.policies.prefix_kv) on what sessions and Mooncake traces add, by hand: a
turn's answer blocks are the next turn's hits, Mooncake block ids share blocks, a request's key runs, and the
cost of a chunk that starts on cached context (vllm/v1/core/kv_cache_manager.py, block_pool.py); sarathi and
vllm with `--enable-prefix-caching`. The rules
vLLM and the twin share (full blocks only, never the last token, LRU eviction tail first, re-hit after
preemption) are in tests/test_vllm_v1.py, and step by step against vLLM itself in
tests/test_vllm_v1_vs_vllm.py."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from policy_cases import run_plan, shape

from simctl.common.errors import InputError
from simctl.costs.features import plan_features
from simctl.policies.prefix_kv import GROUP, HASH_ID, OWN, SESSION, PrefixCachingKV, content_key
from simctl.policies.registry import check_options, make_policy
from simctl.policies.seq import Phase, Seq
from simctl.policies.vllm_v1 import VLLMV1
from simctl.traces.request import Request


def v1(blocks: int = 100, block: int = 4) -> VLLMV1:
    policy = make_policy("vllm-v1", blocks * block, 4096, {"block_size": block, "enable_prefix_caching": 1})
    assert isinstance(policy, VLLMV1)
    return policy


def run_to_end(policy: VLLMV1, seq: Seq) -> None:
    policy.add(seq)
    while seq.phase is not Phase.FINISHED:
        run_plan(policy, policy.schedule())


def test_a_turn_s_answer_blocks_are_the_next_turn_s_hits() -> None:
    policy = v1()
    first = Seq(0, 0.0, 10, 7, session=3)
    run_to_end(policy, first)
    # 10 prompt tokens and 6 of its 7 answer tokens were computed (the last sampled is never fed back): blocks
    # 0-3 are full and cached, blocks 2 and 3 holding answer tokens
    second = Seq(1, 1.0, 17 + 5, 3, session=3)  # the whole context, its last answer token included, + 5 new
    policy.add(second)
    plan = policy.schedule()
    assert shape(plan) == [(1, 6)] and plan.prefill_c == [16]
    assert (policy.hits, policy.queries) == (16, 10 + 22)
    run_plan(policy, plan)
    other = Seq(2, 2.0, 22, 1, session=4)  # another session's tokens are its own
    policy.add(other)
    assert policy.schedule().prefill_c == [0]


def test_a_whole_cached_context_still_computes_its_last_block() -> None:
    policy = v1()
    run_to_end(policy, Seq(0, 0.0, 10, 7, session=3))
    again = Seq(1, 1.0, 16, 1, session=3)  # 16 tokens, all 4 blocks cached: the last token's block is not hit
    policy.add(again)
    plan = policy.schedule()
    assert shape(plan) == [(1, 4)] and plan.prefill_c == [12]


def test_mooncake_ids_share_the_blocks_they_cover() -> None:
    policy = v1()
    # ids of 8 tokens over blocks of 4: block j is keyed by the id covering its last token, ids[(4j + 3) // 8]
    run_to_end(policy, Seq(0, 0.0, 20, 1, hash_ids=(0, 1, 2), hash_block=8))
    cases = [((0, 1, 5), 16), ((0, 7, 2), 8), ((9, 1, 2), 0)]  # a changed id changes every block after it
    for i, (ids, hit) in enumerate(cases, start=1):
        s = Seq(i, float(i), 20, 1, hash_ids=ids, hash_block=8)
        policy.add(s)
        plan = policy.schedule()
        assert plan.prefill_c == [hit], ids
        run_plan(policy, plan)


def test_keys_run_from_shared_prefix_to_ids_to_the_request_s_own() -> None:
    kv = PrefixCachingKV(400, 4, caching=True)
    s = Seq(7, 0.0, 30, 5, prefix_group=2, prefix_tokens=8, hash_ids=(5, 6), hash_block=10)
    # blocks 0-1 in the shared prefix; 2-4 end within the ids' 20 tokens (block 4 ends at 20); the rest own
    group, ids, own = content_key(GROUP, 2), content_key(HASH_ID, 6), content_key(OWN, 7)
    assert kv._keys(s, 7)[:7] == [group, group + 1, ids + 2, ids + 3, ids + 4, own + 5, own + 6]
    assert len(kv._keys(s, 7)) == (30 + 5 - 1) // 4  # made at once: every block it can fill
    turn = Seq(8, 0.0, 12, 5, session=1)
    assert kv._keys(turn, 2)[:2] == [content_key(SESSION, 1), content_key(SESSION, 1) + 1]


@given(st.lists(st.tuples(st.sampled_from((GROUP, HASH_ID, SESSION, OWN)), st.integers(0, 2 ** 40),
                          st.integers(0, 2 ** 32)), min_size=2, max_size=50, unique=True))
def test_a_key_names_one_kind_identity_and_place(blocks: list[tuple[int, int, int]]) -> None:
    # a block's key is content_key(kind, identity) + its place: distinct blocks, distinct keys
    assert len({content_key(kind, identity) + place for kind, identity, place in blocks}) == len(blocks)


def test_a_chunk_on_cached_context_pays_attention_over_it() -> None:
    policy = v1()
    run_to_end(policy, Seq(0, 0.0, 10, 7, session=3))
    policy.add(Seq(1, 1.0, 22, 3, session=3))
    features = plan_features(policy.schedule())
    # 6 new tokens through the linear layers, attending to the 16 cached ones and causally to each other
    assert features["linear_tokens"] == 6
    assert features["attn_units"] == 6 * (16 + 6 / 2) and features["attn_kv_tokens"] == 16 + 6


def shared(i: int, prompt: int = 40) -> Seq:
    return Seq(i, float(i), prompt, 2, prefix_group=0, prefix_tokens=32)


@pytest.mark.parametrize("name", ["sarathi", "vllm"])
def test_sarathi_and_vllm_may_cache_prefixes_in_vllm_s_block_pool(name: str) -> None:
    for caching, hit in [(1, 32), (0, 0)]:
        policy = make_policy(name, 100 * 16, 4096, {"enable_prefix_caching": caching})
        assert policy.shares_prefixes == bool(caching)
        a, b = shared(0), shared(1)
        policy.add(a)
        policy.add(b)
        # both admitted in one step (budget 512; vllm: prefills only): the first's two blocks of the shared
        # prefix (blocks of 16) get their hash when scheduled, and the second finds them at once
        plan = policy.schedule()
        assert shape(plan) == [(0, 40), (1, 40 - hit)] and plan.prefill_c == [0, hit]
        run_plan(policy, plan)
        assert policy.stats() == ({"prefix_cache_hits": 32, "prefix_cache_queries": 80,
                                   "prefix_cache_preempted_hits": 0,
                                   "prefix_cache_preempted_queries": 0} if caching else {})
        assert ("enable_prefix_caching" in policy.settings.as_dict()) == bool(caching)


def test_sarathi_hashes_each_chunk_as_it_is_scheduled() -> None:
    policy = make_policy("sarathi", 100 * 16, 4096, {"enable_prefix_caching": 1, "token_budget": 16})
    assert isinstance(policy.kv, PrefixCachingKV)
    policy.add(shared(0))
    run_plan(policy, policy.schedule())  # its first chunk, tokens 0-15: block 0 hashed
    assert len(policy.kv.lookup(shared(1))) == 1  # block 1 is not, though set aside at admission
    plan = policy.schedule()  # its second chunk: block 1 hashed now, and the plan is not repeated unscheduled
    assert shape(plan) == [(0, 16)] and policy.chunk_repeats(plan) == 0
    assert len(policy.kv.lookup(shared(1))) == 2


def test_other_policies_refuse_prefix_caching_in_one_line() -> None:
    with pytest.raises(InputError, match="--enable-prefix-caching applies only to the policies vllm, "
                                         "vllm-v1, sarathi, .*; not to 'orca'"):
        check_options("orca", {"enable_prefix_caching": 1})


def test_a_freed_request_releases_only_the_blocks_no_other_holds() -> None:
    kv = PrefixCachingKV(10 * 4, 4, caching=True)  # 10 blocks of 4
    a, b = (Seq(i, 0.0, 16, 2, prefix_group=0, prefix_tokens=8) for i in (0, 1))
    kv.admit(a)
    kv.allocate(a, 16)  # its 4 prompt blocks hashed: 2 of the shared prefix, 2 its own
    kv.admit(b)  # b holds the 2 shared ones too (a lookup never covers a prompt's last token: 2 hits)
    shared, own = kv.tables[0][:2], kv.tables[0][2:]
    assert kv.tables[1][:2] == shared and [kv.refs[x] for x in shared] == [2, 2]
    kv.free(a)  # its own hashed blocks stay cached and become evictable, tail first; the shared stay held
    assert list(kv.evictable) == own[::-1] and [kv.refs[x] for x in shared] == [1, 1]
    kv.free(b)
    assert list(kv.evictable) == [*own[::-1], *shared[::-1]] and kv.free_blocks == 10


def test_decodes_grow_together_or_not_at_all() -> None:
    kv = PrefixCachingKV(3 * 4, 4, caching=True)  # 3 blocks of 4
    a, b = Seq(0, 0.0, 4, 5), Seq(1, 0.0, 4, 5)
    for s in (a, b):
        kv.admit(s)
        kv.allocate(s, 4)
        s.advance(4)  # its first block full: its next token needs a new block
    assert kv.free_blocks == 1
    assert not kv.grow_each([a, b]) and kv.free_blocks == 1 and kv.held == {0: 4, 1: 4}
    assert kv.grow_each([a]) and kv.free_blocks == 0


def test_simctl_s_own_engine_refuses_mooncake_ids_and_sessions_with_caching() -> None:
    from simctl.catalogue.models import get_model
    from simctl.engine.setup import RealConfig, size_run

    per_token = get_model("tiny").kv_bytes_per_token(4)
    config = RealConfig(policy="sarathi", model="tiny", options={"enable_prefix_caching": 1})
    for shared_ in ({"hash_ids": (0, 1), "hash_block": 32}, {"session": 0}):
        requests = [Request(i, 0.0, 40, 4, **shared_) for i in range(2)]
        with pytest.raises(InputError, match="sarathi reuses cached prompt prefixes across requests"):
            size_run(config, requests, per_token, 1 << 30)
        size_run(RealConfig(policy="sarathi", model="tiny"), requests, per_token, 1 << 30)  # caching off
