"""Plans carry their execution shape: what an executor runs is read off the plan, never off cost features."""

from __future__ import annotations

from simctl.policies.plan import Layout, hybrid, packed, padded_decode, padded_prefill
from simctl.policies.seq import Seq


def _seq(i: int, prompt: int, output: int, computed: int = 0, generated: int = 0) -> Seq:
    s = Seq(i, 0.0, prompt, output)
    s.computed, s.generated = computed, generated
    return s


def test_padded_prefill_shape() -> None:
    seqs = [_seq(0, 7, 3), _seq(1, 12, 3), _seq(2, 5, 3)]
    plan = padded_prefill(seqs)
    assert (plan.layout, plan.rows, plan.row_len, plan.idle_rows) == (Layout.PADDED, 3, 12, 0)
    assert plan.linear_tokens == 3 * 12 and plan.prefill_tokens == 24
    assert plan.sampling() == [True, True, True]  # a whole prompt samples its first token


def test_padded_decode_keeps_finished_rows() -> None:
    live = [_seq(0, 10, 9, computed=14, generated=5), _seq(1, 6, 9, computed=10, generated=5)]
    plan = padded_decode(live, rows=4, kv_len=15)  # two finished rows still computed
    assert (plan.rows, plan.idle_rows, plan.row_len, plan.kv_len) == (4, 2, 1, 15)
    assert plan.decode_rows == 4 and plan.decode_kv == 4 * 15 and plan.decode_tokens == 2


def test_packed_sampling_marks_rows_reaching_their_last_known_token() -> None:
    decode = _seq(0, 10, 5, computed=11, generated=2)  # knows 12 tokens, caches its 12th now
    chunk = _seq(1, 100, 5, computed=40)  # a mid-prompt chunk samples nothing
    last = _seq(2, 30, 5, computed=20)  # the prompt's last chunk samples token 1
    plan = hybrid([decode], [chunk, last], [30, 10])
    assert (plan.layout, plan.rows, plan.row_len, plan.idle_rows) == (Layout.PACKED, 3, 0, 0)
    assert plan.sampling() == [True, False, True]
    assert plan.sampled_tokens == sum(plan.sampling())
    reordered = packed([chunk, decode, last], [30, 1, 10])
    assert reordered.seqs == [decode, chunk, last] and reordered.sampling() == plan.sampling()
