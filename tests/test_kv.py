"""KV managers: paged block accounting, the admission watermark, exact common growth, fixed reservations."""

from __future__ import annotations

import copy

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.policies.kv import PagedKV, ReservedKV
from simctl.policies.seq import Seq


def seq(i: int, prompt: int, output: int = 10) -> Seq:
    return Seq(i, 0.0, prompt, output)


# --- PagedKV: hand cases ---

def test_paged_capacity_is_whole_blocks() -> None:
    kv = PagedKV(100)  # 6 blocks of 16; the 4 leftover slots are unusable
    assert (kv.block_size, kv.num_blocks, kv.capacity) == (16, 6, 96)
    assert kv.used == 0 and kv.free_blocks == 6
    assert kv.watermark_blocks == 0  # int(0.01 * 6)


def test_paged_admit_grow_free_block_accounting() -> None:
    kv = PagedKV(96, watermark=0.0)
    a = seq(0, 17)
    assert kv.can_admit(a)
    kv.admit(a)  # 17 prompt tokens -> 2 blocks
    assert kv.held[0] == 2 * 16 and kv.free_blocks == 4 and kv.used == 32
    a.advance(17)  # prefill cached 17 tokens, sampled token 1
    # tokens 18..32 still fit in the two blocks held
    assert kv.can_grow(a, 15) and kv._extra_blocks(a, 15) == 0
    kv.grow(a)
    assert kv.held[0] == 2 * 16 and kv.used == 32
    kv.grow(a, 15)  # cache up to 32 tokens: still 2 blocks
    assert kv.held[0] == 2 * 16
    kv.grow(a, 16)  # up to 33 tokens: a third block
    assert kv.held[0] == 3 * 16 and kv.used == 48
    assert kv.can_grow(a, 96 - 17) and not kv.can_grow(a, 96 - 17 + 1)  # 96 slots in all
    b = seq(1, 1)
    kv.admit(b)  # even one token takes a whole block
    assert kv.held[1] == 1 * 16 and kv.used == 64
    kv.free(a)
    assert kv.used == 16 and 0 not in kv.held
    kv.free(b)
    assert kv.used == 0 and kv.free_blocks == kv.num_blocks and not kv.held


def test_paged_grow_is_idempotent_for_already_allocated_steps() -> None:
    kv = PagedKV(160, watermark=0.0)
    a = seq(0, 16)
    kv.admit(a)
    a.advance(16)
    kv.grow(a, 1)  # token 17 needs block 2
    assert kv.held[0] == 2 * 16
    kv.grow(a, 1)  # asking again for the same step takes nothing more
    assert kv.held[0] == 2 * 16 and kv.free_blocks == 8


def test_paged_admit_covers_recompute_prefill() -> None:
    kv = PagedKV(320, watermark=0.0)
    a = seq(0, 10, 40)
    a.advance(10)
    for _ in range(20):
        a.advance(1)
    assert a.generated == 21 and a.computed == 30
    a.reset_for_recompute()  # must prefill 10 prompt + 21 generated tokens again
    kv.admit(a)
    assert kv.held[0] == 2 * 16  # ceil(31 / 16)


def test_paged_watermark_applies_at_admission_only() -> None:
    kv = PagedKV(160, watermark=0.2)  # 10 blocks, 2 kept back at admission
    assert kv.watermark_blocks == 2
    assert kv.can_admit(seq(0, 128))  # 8 blocks leave exactly the watermark
    assert not kv.can_admit(seq(0, 129))  # 9 blocks would dig into it
    assert kv.max_request_tokens == 128
    a = seq(1, 64)
    kv.admit(a)  # 4 blocks, 6 free
    assert kv.can_admit(seq(2, 64)) and not kv.can_admit(seq(2, 65))
    b = seq(2, 64)
    kv.admit(b)  # 2 free == watermark
    assert kv.free_blocks == kv.watermark_blocks
    assert not kv.can_admit(seq(3, 1))
    # a running sequence may grow into the watermark
    a.advance(64)
    assert kv.can_grow(a, 32) and not kv.can_grow(a, 33)
    kv.grow(a, 32)
    assert kv.free_blocks == 0 and kv.used == kv.capacity


# --- PagedKV: max_common_growth against brute force ---

def brute_common_growth(kv: PagedKV, seqs: list[Seq], limit: int) -> int:
    """Largest k <= limit such that growing every sequence by k, one after the other, succeeds."""
    for k in range(limit, -1, -1):
        trial = copy.deepcopy(kv)
        ok = True
        for s in seqs:
            if not trial.can_grow(s, k):
                ok = False
                break
            trial.grow(s, k)
        if ok:
            return k
    raise AssertionError("k = 0 must always fit")


@st.composite
def paged_states(draw: st.DrawFn) -> tuple[PagedKV, list[Seq], int]:
    block = draw(st.sampled_from([1, 2, 3, 4, 16]))
    nblocks = draw(st.integers(1, 24))
    kv = PagedKV(nblocks * block, block_size=block, watermark=0.0)
    seqs = []
    for i in range(draw(st.integers(0, 6))):
        s = Seq(i, 0.0, draw(st.integers(1, 40)), 100)
        if not kv.can_admit(s):
            continue
        kv.admit(s)
        # anywhere in the prefill or past it, with possibly some steps already grown
        done = draw(st.integers(0, s.prompt_tokens))
        s.computed = done
        if done == s.prompt_tokens:
            s.advance(0)  # reaching the end of the prompt samples a token
            grown = draw(st.integers(0, 3 * block))
            if grown and kv.can_grow(s, grown):
                kv.grow(s, grown)
        seqs.append(s)
    limit = draw(st.integers(0, 5 * block + 3))
    return kv, seqs, limit


@settings(max_examples=200, deadline=None)
@given(paged_states())
def test_paged_max_common_growth_matches_brute_force(state: tuple[PagedKV, list[Seq], int]) -> None:
    kv, seqs, limit = state
    k = kv.max_common_growth(seqs, limit)
    assert k == brute_common_growth(kv, seqs, limit)
    before = kv.free_blocks
    for s in seqs:  # and it really can be granted
        kv.grow(s, k)
    assert 0 <= kv.free_blocks <= before


def test_paged_max_common_growth_hand_case() -> None:
    kv = PagedKV(64, watermark=0.0)  # 4 blocks
    a, b = seq(0, 16), seq(1, 8)
    kv.admit(a)
    kv.admit(b)  # 2 free blocks
    a.advance(16)
    b.advance(8)
    # a has 0 slack, b has 8: k steps need ceil(k/16) + ceil((k-8)/16) blocks <= 2
    assert kv.max_common_growth([a, b], 100) == 16
    assert kv.max_common_growth([a, b], 5) == 5
    assert kv.max_common_growth([a], 100) == 32
    assert kv.max_common_growth([], 7) == 7


# --- ReservedKV ---

def test_reserved_kv() -> None:
    kv = ReservedKV(100, 30)
    assert kv.slots == 3 and kv.used == 0
    a, b, c, d = (seq(i, 5) for i in range(4))
    for s in (a, b, c):
        assert kv.can_admit(s)
        kv.admit(s)
    assert kv.used == 90
    assert not kv.can_admit(d)
    with pytest.raises(AssertionError):
        kv.admit(d)
    a.advance(5)
    assert kv.can_grow(a, 25) and not kv.can_grow(a, 26)
    kv.grow(a, 25)
    assert kv.used == 90  # growth never takes more
    with pytest.raises(AssertionError):
        kv.grow(a, 26)
    b.advance(5)
    b.advance(1)
    assert kv.max_common_growth([a, b], 100) == 24
    assert kv.max_common_growth([a, b], 3) == 3
    kv.free(b)
    assert kv.used == 60 and kv.can_admit(d)
    kv.admit(d)
    for s in (a, c, d):
        kv.free(s)
    assert kv.used == 0
