"""What a policy decides for one iteration, and the shape of the work the hardware then executes.

A `BatchPlan` is plain data. It names the sequences scheduled and how many new tokens each processes (a prompt
chunk, a whole prompt, or one decode token) and carries its execution shape: the layout, the rows executed
(`rows`: padded batches keep computing finished rows), the padded row length (`row_len`), the KV columns
every padded decode row reads (`kv_len`), and which rows sample (`sampling()`). An executor runs exactly that;
it never reverse-engineers the shape from cost features.

Its feature fields are what a cost model prices: the tokens the linear layers really process (padding
included), the attention segments of prefills/chunks on cached context, and the KV tokens read by decode rows
(padded KV included). The builders below are the only place those are derived from the shape, so the
simulator and the real engine see the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from operator import attrgetter

from simctl.policies.seq import Seq

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
    # execution shape beyond the scheduled sequences (PADDED layouts)
    row_len: int = 0  # tokens per row of a padded batch (L; 1 for a decode step); 0: ragged
    kv_len: int = 0  # KV columns every row of a padded decode step reads (pads included)
    idle_rows: int = 0  # rows computed for sequences already finished (their outputs are discarded)
    # prefill segments computed as whole q x (c + q) score blocks under an explicit mask (Hugging Face's
    # padded batches, Prepacking's bins) rather than by a causal kernel that skips the upper triangle
    dense_attention: bool = False
    bins: list[list[int]] = field(default_factory=list)  # BINPACKED: indices into `seqs`, one list per row
    # a request-level batch's prefill, or one group of it (FasterTransformer and its kin): the whole batch has
    # this many rows, and they stay in it, computed even once finished, until all of them have finished
    batch_rows: int = 0
    # work run at the same time on separate streams of the same device (Baton-PD's prefill beside the batch's
    # decode; built by `concurrent`): the fields above are the streams' sums, which the loop applies; a cost
    # model prices the streams sharing the device
    streams: tuple[BatchPlan, ...] = ()

    @property
    def decode_only(self) -> bool:
        return not self.prefill_q

    @property
    def rows(self) -> int:
        """Rows the executor computes: one per scheduled sequence, plus a padded batch's finished rows."""
        return len(self.seqs) + self.idle_rows

    def sampling(self) -> list[bool]:
        """Per scheduled sequence, whether this iteration samples its next token (it reaches the last known
        token). Read before the iteration is applied."""
        return [s.computed + q == s.prompt_tokens + s.generated for s, q in zip(self.seqs, self.num_new)]


def hybrid(decodes: list[Seq], prefills: list[Seq], chunks: list[int]) -> BatchPlan:
    """A ragged batch of single-token decodes and prefill segments (whole prompts or chunks): the linear
    layers see exactly the new tokens and each segment attends only to its own cache."""
    rows = len(decodes)
    kv = sum(map(_computed, decodes)) + rows
    if not prefills:  # a decode step, the most common plan: nothing else to derive
        return BatchPlan(decodes, [1] * rows, Layout.PACKED, rows, rows, chunks, [], rows, kv, 0, rows)
    contexts = [s.computed for s in prefills]
    sampled = sum(1 for s, c, q in zip(prefills, contexts, chunks) if c + q == s.prompt_tokens + s.generated)
    prefill = sum(chunks)
    return BatchPlan(decodes + prefills, [1] * rows + chunks, Layout.PACKED, prefill + rows, sampled + rows,
                     chunks, contexts, rows, kv, prefill, rows)


def packed(seqs: list[Seq], num_new: list[int]) -> BatchPlan:
    """`hybrid` for sequences in any order: decodes are put first, as every plan lists them."""
    decodes = [s for s in seqs if not s.in_prefill]
    prefills = [(s, q) for s, q in zip(seqs, num_new) if s.in_prefill]
    return hybrid(decodes, [s for s, _ in prefills], [q for _, q in prefills])


def padded_prefill(seqs: list[Seq], dense: bool = False) -> BatchPlan:
    """A B x L prefill of whole prompts, every row padded to the longest (pads are computed; every row reaches
    the LM head); `dense`: attention under an explicit padding mask (see `BatchPlan.dense_attention`)."""
    rows = len(seqs)
    length = max(s.prefill_remaining for s in seqs)
    num_new = [s.prefill_remaining for s in seqs]
    return BatchPlan(seqs, num_new, Layout.PADDED, rows * length, rows, [length] * rows, [0] * rows,
                     prefill_tokens=sum(num_new), row_len=length, dense_attention=dense)


def binpacked_prefill(seqs: list[Seq], bins: list[list[int]], varlen: bool = False) -> BatchPlan:
    """Whole prompts packed into rows of L tokens, L = the longest prompt (Prepacking): row b holds the
    prompts `bins[b]` (indices into `seqs`) back to back, each attending only to itself from position 0
    (independent causal masks, restarted positions), then pads. The linear layers compute len(bins) x L
    tokens, attention is a dense-masked L x L block per row (what the paper ran) or, `varlen`, causal within
    each prompt (a variable-length kernel), and every prompt's last token reaches the LM head."""
    length = max(s.prefill_remaining for s in seqs)
    num_new = [s.prefill_remaining for s in seqs]
    if sorted(i for b in bins for i in b) != list(range(len(seqs))) or any(
            sum(num_new[i] for i in b) > length for b in bins):
        raise ValueError("bins must hold every prompt once, within the longest prompt's length")
    rows = len(bins)
    segments = num_new if varlen else [length] * rows
    return BatchPlan(seqs, num_new, Layout.BINPACKED, rows * length, len(seqs), segments, [0] * len(segments),
                     prefill_tokens=sum(num_new), row_len=length, dense_attention=not varlen, bins=bins)


def padded_decode(seqs: list[Seq], rows: int, kv_len: int) -> BatchPlan:
    """One decode step of a padded batch of `rows` rows, each holding `kv_len` KV columns (pads included).

    Rows of finished requests stay in the batch and are computed like live ones.
    """
    return BatchPlan(seqs, [1] * len(seqs), Layout.PADDED, rows, rows, decode_rows=rows,
                     decode_kv=rows * kv_len, decode_tokens=len(seqs), row_len=1, kv_len=kv_len,
                     idle_rows=rows - len(seqs))


def concurrent(decode: BatchPlan, prefill: BatchPlan) -> BatchPlan:
    """A decode step and a prefill run at the same time on two streams of one device, ending together: one
    iteration whose sequences are the decode's then the prefill's, its features their sums."""
    if not decode.decode_only or prefill.decode_tokens:
        raise ValueError("concurrent: a decode-only plan and a plan of prefills only")
    return BatchPlan(decode.seqs + prefill.seqs, decode.num_new + prefill.num_new, decode.layout,
                     decode.linear_tokens + prefill.linear_tokens,
                     decode.sampled_tokens + prefill.sampled_tokens,
                     prefill.prefill_q, prefill.prefill_c, decode.decode_rows, decode.decode_kv,
                     prefill.prefill_tokens, decode.decode_tokens, decode.row_len, decode.kv_len,
                     decode.idle_rows, prefill.dense_attention, streams=(decode, prefill))


def padded_insertion(seqs: list[Seq], width: int) -> BatchPlan:
    """Baton's insertion step: newcomers' whole prompts join a running padded batch whose rows hold `width` KV
    columns (placeholders included). Every row is padded to the longest newcomer prompt L, so the running rows
    compute L tokens for their one real token; each row's L queries attend, under an explicit mask, to all
    width + L columns. The rows' KV gains L columns; every row samples."""
    num_new = [s.prefill_remaining if s.in_prefill else 1 for s in seqs]
    rows, length = len(seqs), max(num_new)
    prefill = sum(q for s, q in zip(seqs, num_new) if s.in_prefill)
    return BatchPlan(seqs, num_new, Layout.PADDED, rows * length, rows, [length] * rows, [width] * rows,
                     prefill_tokens=prefill, decode_tokens=sum(num_new) - prefill, row_len=length,
                     kv_len=width + length, dense_attention=True)
