"""What a policy decides for one iteration, and the shape of the work the hardware then executes.

A `BatchPlan` names the sequences scheduled and how many new tokens each processes (a prompt chunk, a whole
prompt, or one decode token). Its shape fields are what a cost model prices: the tokens the linear layers
really process (padding included), the attention segments of prefills/chunks on cached context, and the KV
tokens read by decode rows (padded KV included). The builders below are the only place those are computed,
so the simulator and the real engine see the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter

from policies.seq import Seq

_computed = attrgetter("computed")


class Layout(Enum):
    PACKED = "packed"  # ragged: every token is a real token (varlen attention)
    PADDED = "padded"  # B rows x L columns: pad tokens are computed too
    BINPACKED = "binpacked"  # prompts packed into bins of equal length (Prepacking)


@dataclass(slots=True)
class BatchPlan:
    seqs: list[Seq]  # the `decode_tokens` decodes come first
    num_new: list[int]  # new tokens per scheduled sequence this iteration
    layout: Layout
    linear_tokens: int  # T: rows through the linear layers, padding included
    sampled_tokens: int  # rows that reach the LM head
    prefill_q: list[int] = field(default_factory=list)  # attention segments of more than one new token...
    prefill_c: list[int] = field(default_factory=list)  # ...and the cached context each one attends to
    decode_rows: int = 0  # single-token rows, padding rows included
    decode_kv: int = 0  # KV tokens read by the decode rows, padded KV included
    prefill_tokens: int = 0  # real (unpadded) prompt tokens processed
    decode_tokens: int = 0  # real decode tokens processed

    @property
    def decode_only(self) -> bool:
        return not self.prefill_q


def hybrid(decodes: list[Seq], prefills: list[Seq], chunks: list[int]) -> BatchPlan:
    """A ragged batch of single-token decodes and prefill segments (whole prompts or chunks): the linear
    layers see exactly the new tokens and each segment attends only to its own cache."""
    rows = len(decodes)
    contexts = [s.computed for s in prefills]
    sampled = sum(1 for s, c, q in zip(prefills, contexts, chunks) if c + q == s.prompt_tokens + s.generated)
    prefill = sum(chunks)
    return BatchPlan(decodes + prefills, [1] * rows + chunks, Layout.PACKED, prefill + rows, sampled + rows,
                     chunks, contexts, rows, sum(map(_computed, decodes)) + rows, prefill, rows)


def packed(seqs: list[Seq], num_new: list[int]) -> BatchPlan:
    """`hybrid` for sequences in any order: decodes are put first, as every plan lists them."""
    decodes = [s for s in seqs if not s.in_prefill]
    prefills = [(s, q) for s, q in zip(seqs, num_new) if s.in_prefill]
    return hybrid(decodes, [s for s, _ in prefills], [q for _, q in prefills])


def padded_prefill(seqs: list[Seq], rows: int | None = None) -> BatchPlan:
    """A B x L prefill of whole prompts, every row padded to the longest (pads are computed)."""
    rows = len(seqs) if rows is None else rows
    length = max(s.prefill_remaining for s in seqs)
    num_new = [s.prefill_remaining for s in seqs]
    return BatchPlan(seqs, num_new, Layout.PADDED, rows * length, rows, [length] * rows, [0] * rows,
                     prefill_tokens=sum(num_new))


def padded_decode(seqs: list[Seq], rows: int, kv_len: int) -> BatchPlan:
    """One decode step of a padded batch of `rows` rows, each holding `kv_len` KV columns (pads included).

    Rows of finished requests stay in the batch and are computed like live ones.
    """
    return BatchPlan(seqs, [1] * len(seqs), Layout.PADDED, rows, rows, decode_rows=rows, decode_kv=rows * kv_len,
                     decode_tokens=len(seqs))
