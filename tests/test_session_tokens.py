"""A session's turn resends its context as token ids (`traces.tokens.SessionPrompts`): the turn before's
prompt, the ids the engine generated for it, then new ids; and the twin's block keys
(`PrefixCachingKV._key`) name equal blocks exactly where those ids are equal, so that its hits are the ones
a real prefix cache finds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.policies.prefix_kv import PrefixCachingKV
from simctl.policies.seq import Seq
from simctl.traces.request import Request
from simctl.traces.tokens import SessionPrompts, prompt_token_ids

VOCAB = 50_000


def test_a_later_turn_is_the_turn_before_its_output_and_its_own_new_ids() -> None:
    first = Request(0, 0.0, 10, 3, prefix_group=2, prefix_tokens=4, session=7)
    later = Request(1, 0.0, 18, 1, prefix_group=2, prefix_tokens=4, session=7, previous=0)
    prompts = SessionPrompts([first, later], VOCAB, seed=3)
    ids0 = prompts.prompt(first)
    assert ids0 == prompt_token_ids(first, VOCAB, 3)
    prompts.generated(0, [0, 5, 9])  # id 0 too: whatever the engine sampled is sent back
    ids1 = prompts.prompt(later)
    assert len(ids1) == 18 and ids1[:13] == ids0 + [0, 5, 9]
    # its 5 new ids are its own: the first 5 of what the same request would have without a session
    alone = prompt_token_ids(Request(1, 0.0, 5, 1), VOCAB, 3)
    assert ids1[13:] == alone


def test_a_turn_shorter_than_its_context_or_an_id_outside_the_vocabulary_is_an_error() -> None:
    first = Request(0, 0.0, 10, 3, session=0)
    short = Request(1, 0.0, 12, 1, session=0, previous=0)
    prompts = SessionPrompts([first, short], VOCAB)
    prompts.prompt(first)
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        prompts.generated(0, [1, VOCAB, 2])
    prompts.generated(0, [1, 2, 3])
    with pytest.raises(RuntimeError, match="12 prompt tokens, fewer than its session's context of 13"):
        prompts.prompt(short)


@pytest.mark.parametrize("later", [
    Request(1, 0.0, 20, 1, session=1, previous=0),  # another session
    Request(1, 0.0, 20, 1, session=0, previous=9),  # no such turn
    Request(1, 0.0, 20, 1, session=0, previous=1),  # itself: it would wait forever
    Request(1, 0.0, 20, 1, session=0, previous=0, prefix_group=1, prefix_tokens=4),  # another shared prefix
])
def test_a_turn_the_twin_would_not_see_as_its_session_stream_is_refused(later: Request) -> None:
    with pytest.raises(RuntimeError, match="not an earlier turn of the same session"):
        SessionPrompts([Request(0, 0.0, 10, 3, session=0), later], VOCAB)


@st.composite
def sessions(draw: st.DrawFn) -> tuple[list[Request], int]:
    """A few sessions of a few turns (some sharing a system prompt), each turn's prompt its context plus new
    tokens; small blocks so that prompts span many."""
    block = draw(st.sampled_from([1, 2, 4, 8]))
    system = draw(st.integers(0, 20))
    requests: list[Request] = []
    for s in range(draw(st.integers(1, 4))):
        shared = {"prefix_group": 0, "prefix_tokens": system} if system and draw(st.booleans()) else {}
        context, previous = (system if shared else 0), -1
        for _ in range(draw(st.integers(1, 4))):
            prompt = context + draw(st.integers(1 if previous < 0 else 0, 30))
            output = draw(st.integers(1, 20))
            requests.append(Request(len(requests), 0.0, prompt, output, session=s, previous=previous,
                                    **shared))
            context, previous = prompt + output, len(requests) - 1
    return requests, block


@given(sessions(), st.integers(0, 2**32 - 1))
@settings(max_examples=60, deadline=None)
def test_twin_block_keys_are_equal_exactly_where_the_ids_up_to_the_block_are(case, seed: int) -> None:
    requests, block = case
    prompts, rng = SessionPrompts(requests, VOCAB, seed), np.random.default_rng(seed)
    kv = PrefixCachingKV(10**6, block, caching=True)
    by_key: dict[tuple, tuple[int, ...]] = {}
    by_ids: dict[tuple[int, ...], tuple] = {}
    for r in requests:  # in order: every turn after the one before it
        ids = prompts.prompt(r)
        assert len(ids) == r.prompt_tokens
        prompts.generated(r.id, rng.integers(0, VOCAB, r.output_tokens).tolist())
        seq = Seq.of(r)
        for i, key in enumerate(kv._make_keys(seq, 0, r.prompt_tokens // block)):
            content = tuple(ids[:(i + 1) * block])
            assert by_key.setdefault(key, content) == content
            assert by_ids.setdefault(content, key) == key


def test_a_mooncake_request_is_its_hash_blocks_ids_then_its_own() -> None:
    a = Request(0, 0.0, 10, 1, hash_ids=(7, 8, 9), hash_block=4)  # blocks of 4, 4 and a partial 2
    b = Request(1, 0.0, 13, 1, hash_ids=(7, 8), hash_block=4)  # 7 and 8 as a's, then 5 of its own
    ia, ib = prompt_token_ids(a, VOCAB, 5), prompt_token_ids(b, VOCAB, 5)
    assert len(ia) == 10 and len(ib) == 13 and ia[:8] == ib[:8] and ia[8:] != ib[8:10]
    assert ib[8:] == prompt_token_ids(Request(1, 0.0, 5, 1), VOCAB, 5)  # its own: as without hash ids
    # a block's ids depend on its hash id only: a partial 9 is the first ids of a whole one
    whole = Request(2, 0.0, 12, 1, hash_ids=(7, 8, 9), hash_block=4)
    assert ia[8:] == prompt_token_ids(whole, VOCAB, 5)[8:10]
    with pytest.raises(RuntimeError, match="both a shared prefix group and Mooncake hash ids"):
        prompt_token_ids(Request(3, 0.0, 10, 1, prefix_group=0, prefix_tokens=4, hash_ids=(7,), hash_block=4),
                         VOCAB)


@st.composite
def mooncake_rows(draw: st.DrawFn) -> tuple[list[Request], int]:
    """Requests with chained hash ids as Mooncake's (each continues a run of an earlier one's first ids, then
    new ids), prompts from within their last block to past the ids' reach; hash and KV blocks of any sizes."""
    hash_block, block = draw(st.integers(1, 8)), draw(st.sampled_from([1, 2, 4, 8]))
    requests: list[Request] = []
    fresh = 0
    for i in range(draw(st.integers(1, 8))):
        ids: tuple[int, ...] = ()
        if requests and draw(st.booleans()):
            parent = draw(st.sampled_from(requests)).hash_ids
            ids = parent[:draw(st.integers(1, len(parent)))]
        new = draw(st.integers(0 if ids else 1, 4))
        ids, fresh = ids + tuple(range(fresh, fresh + new)), fresh + new
        prompt = draw(st.integers((len(ids) - 1) * hash_block + 1, len(ids) * hash_block + 6))
        requests.append(Request(i, 0.0, prompt, 1, hash_ids=ids, hash_block=hash_block))
    return requests, block


@given(mooncake_rows(), st.integers(0, 2**32 - 1))
@settings(max_examples=80, deadline=None)
def test_twin_block_keys_of_hash_ids_are_equal_exactly_where_the_ids_are(case, seed: int) -> None:
    requests, block = case
    kv = PrefixCachingKV(10**6, block, caching=True)
    by_key: dict[tuple, tuple[int, ...]] = {}
    by_ids: dict[tuple[int, ...], tuple] = {}
    for r in requests:
        ids = prompt_token_ids(r, VOCAB, seed)
        assert len(ids) == r.prompt_tokens
        for i, key in enumerate(kv._make_keys(Seq.of(r), 0, r.prompt_tokens // block)):
            content = tuple(ids[:(i + 1) * block])
            assert by_key.setdefault(key, content) == content
            assert by_ids.setdefault(content, key) == key
