"""The shapes a profile times, and the plan features each one is described by in profile.csv.

A shape is one iteration: a list of segments (q new tokens on c cached ones, for a prefill/chunk or a decode
row) run either ragged (`[1, T]`, every token real) or padded (`[B, L]`, pads computed). Its features are the
`policies.plan.BatchPlan` fields a cost model prices, computed here exactly as the plan builders compute
them, so a model fitted on profile.csv can price any plan. Its columns, each with its meaning (and its
BatchPlan field):

- kind: prefill, decode, hybrid, padded_prefill (hf-padded's dense-masked ones too), padded_decode,
  padded_insertion (Baton), binpacked_prefill (Prepacking)
- batch_size: sequences in the iteration (len(plan.seqs); padded: rows)
- linear_tokens: T, rows through the linear layers, padding included (plan.linear_tokens)
- sampled_tokens: rows reaching the LM head (plan.sampled_tokens)
- num_segments: prefill segments (len(plan.prefill_q)); padded prefill: one per row
- attn_units: sum over prefill segments of q * (c + q/2); padded rows count as segments of the padded
  length
- attn_kv_tokens: sum over prefill segments of c + q
- decode_rows: single-token rows, padding rows included (plan.decode_rows)
- decode_kv: KV tokens read by decode rows incl. the new one: sum (context + 1); padded: rows x kv_len
- decode_pad_kv: padding to the longest decode row: decode_rows x (longest context + 1) - decode_kv;
  padded: 0
- q, c: a representative chunk and context (prefill: longest q and its c; decode: 1, longest context)
- reps, time_s, time_mean_s, time_p10_s, time_p90_s: repetitions used, their median (the estimate), mean
  and 10th/90th percentile seconds (which repetitions: `profiler/worker.py`; a profile from before
  2026-11-25 has no time_mean_s)

Every shape builds its plan with the policies' plan builders (`Shape.plan`) and its columns come from
`simctl.costs.features.plan_features(plan)`: the features exist in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

import numpy as np

from simctl.costs.features import plan_features
from simctl.costs.graph_buckets import GraphShapes
from simctl.policies.binpack import first_fit_decreasing
from simctl.policies.plan import BatchPlan
from simctl.policies.plan import binpacked_prefill as binpacked_prefill_plan
from simctl.policies.plan import hybrid as hybrid_plan
from simctl.policies.plan import padded_decode as padded_decode_plan
from simctl.policies.plan import padded_insertion as padded_insertion_plan
from simctl.policies.plan import padded_prefill as padded_prefill_plan
from simctl.policies.seq import Seq

Kind = Literal["prefill", "decode", "hybrid", "padded_prefill", "padded_decode", "padded_insertion",
               "binpacked_prefill"]
KINDS: tuple[str, ...] = ("prefill", "decode", "hybrid", "padded_prefill", "padded_decode",
                          "padded_insertion", "binpacked_prefill")
FEATURES = ("kind", "batch_size", "linear_tokens", "sampled_tokens", "num_segments", "attn_units",
            "attn_kv_tokens", "decode_rows", "decode_kv", "decode_pad_kv", "q", "c")
TIMINGS = ("reps", "time_s", "time_mean_s", "time_p10_s", "time_p90_s")
COLUMNS = FEATURES + TIMINGS


@dataclass(frozen=True, slots=True)
class Seg:
    """One segment of a shape: q new tokens on c cached ones; `decode` rows are single-token generation steps
    (priced by decode_kv), every other segment is a prefill or chunk (priced by attention units)."""

    q: int
    c: int = 0
    decode: bool = False
    sample: bool = True


@dataclass(frozen=True, slots=True)
class Shape:
    kind: Kind
    segs: tuple[Seg, ...]
    kv_len: int | None = None  # padded_decode / padded_insertion: KV columns every row reads (pads included)
    note: str = ""
    dense: bool = False  # padded_prefill: under an explicit padding mask (hf-padded), not a causal kernel
    bins: tuple[tuple[int, ...], ...] = ()  # binpacked_prefill: the prompts (segment indices) of each row

    @property
    def padded(self) -> bool:
        return self.kind.startswith("padded")

    @property
    def length(self) -> int:
        """Row length L of a padded or bin-packed batch (ragged: 0)."""
        return max(s.q for s in self.segs) if self.padded or self.bins else 0

    @property
    def slots(self) -> int:
        return len(self.segs)

    @property
    def max_len(self) -> int:
        """Positions a slot needs: the furthest KV position written or read, plus one."""
        if self.padded:
            need = max(s.c for s in self.segs) + self.length
            return max(need, self.kv_len or 0)
        return max(s.c + s.q for s in self.segs)  # bin-packed: each prompt in its own slot from position 0

    @property
    def kv_tokens(self) -> int:
        """Token positions of the KV slab this shape needs (the slab a protocol uses may add to it:
        `Repetitions.slab`)."""
        return self.slots * self.max_len

    def shifted(self, offset: int) -> Shape:
        """This shape with every cached context (c > 0) and the padded KV width `offset` tokens further: one
        repetition of the served protocol (`ShapeProtocol`); fresh prompts (c = 0) stay as they are."""
        if offset == 0:
            return self
        segs = tuple(replace(s, c=s.c + offset) if s.c else s for s in self.segs)
        return replace(self, segs=segs, kv_len=self.kv_len + offset if self.kv_len else self.kv_len)

    def plan(self) -> BatchPlan:
        """The batch this shape is, built by the policies' plan builders (a request stands in for each
        segment), so its features are the ones the simulator prices."""
        if self.kind == "padded_prefill":
            return padded_prefill_plan([Seq(i, 0.0, s.q, 10) for i, s in enumerate(self.segs)],
                                       dense=self.dense)
        if self.kind == "binpacked_prefill":
            return binpacked_prefill_plan([Seq(i, 0.0, s.q, 10) for i, s in enumerate(self.segs)],
                                          [list(b) for b in self.bins])
        if self.kind == "padded_insertion":  # running rows first, then the newcomers' prompts
            seqs = [_decoding(i, s.c) if s.decode else Seq(i, 0.0, s.q, 10) for i, s in enumerate(self.segs)]
            return padded_insertion_plan(seqs, (self.kv_len or 0) - self.length)
        if self.kind == "padded_decode":
            seqs = [_decoding(i, s.c) for i, s in enumerate(self.segs)]
            return padded_decode_plan(seqs, len(seqs), self.kv_len or max(s.c for s in self.segs) + 1)
        decodes = [_decoding(i, s.c) for i, s in enumerate(self.segs) if s.decode]
        prefills = [(_prefilling(i, s.q, s.c, s.sample), s.q) for i, s in enumerate(self.segs)
                    if not s.decode]
        return hybrid_plan(decodes, [s for s, _ in prefills], [q for _, q in prefills])

    def features(self, graphs: GraphShapes | None = None) -> dict[str, object]:
        """The profile columns of this shape as the executor runs it (`graphs`: decode steps replayed from
        CUDA graphs, their batch padded to the graph's)."""
        plan = self.plan()
        if self.kind == "padded_insertion":  # a newcomer's prompt on the batch's width
            q, c = self.length, plan.kv_len - self.length
        elif self.padded or self.bins:  # the representative chunk and context: a padded row
            q, c = (1, plan.kv_len - 1) if self.kind == "padded_decode" else (self.length, 0)
        else:
            pre = [s for s in self.segs if not s.decode]
            rep = max(pre, key=lambda s: (s.q, s.c)) if pre else None
            q, c = (rep.q, rep.c) if rep else (1, max(s.c for s in self.segs))
        return {"kind": self.kind, **plan_features(plan, graphs), "q": q, "c": c}

    def label(self) -> str:
        f = self.features()
        if self.kind in ("prefill", "padded_prefill", "binpacked_prefill", "padded_insertion"):
            if f["num_segments"] == 1 and self.kind == "prefill":
                s = self.segs[0]
                return f"prefill q={s.q}" + (f" c={s.c}" if s.c else "") + ("" if s.sample else " unsampled")
            return f"{self.kind} B={f['batch_size']} T={f['linear_tokens']}"
        if self.kind == "hybrid":
            return f"hybrid {f['decode_rows']} decodes + chunk q={f['q']} c={f['c']}"
        return f"{self.kind} B={f['batch_size']} kv={f['decode_kv']}"


def _decoding(i: int, context: int) -> Seq:
    """A request decoding with `context` tokens cached (its next step reads context + 1)."""
    s = Seq(i, 0.0, context, 10 ** 6)
    s.advance(context)
    return s


def _prefilling(i: int, q: int, c: int, sample: bool) -> Seq:
    """A request with c tokens cached whose next q prompt tokens end its prompt (sampled) or do not."""
    s = Seq(i, 0.0, c + q + (0 if sample else 5), 10)
    if c:
        s.advance(c)
    return s


# ---- shape builders ----------------------------------------------------------------------------------------


def prefill(q: int, c: int = 0, sample: bool = True) -> Shape:
    """One prompt of q tokens (or its last chunk, on c cached tokens); its last token is sampled unless
    `sample` is False (a mid-prompt chunk: no LM-head row)."""
    return Shape("prefill", (Seg(q, c, sample=sample),), note="" if sample else "mid-prompt")


def decode(batch: int, context: int) -> Shape:
    """`batch` decode rows, each with `context` cached tokens."""
    return Shape("decode", tuple(Seg(1, context, decode=True) for _ in range(batch)))


def decode_mixed(contexts: list[int]) -> Shape:
    return Shape("decode", tuple(Seg(1, c, decode=True) for c in contexts), note="mixed contexts")


def padded_decode(contexts: list[int], kv_len: int) -> Shape:
    """A padded decode step: every row reads `kv_len` KV columns whatever its own context."""
    return Shape("padded_decode", tuple(Seg(1, c, decode=True) for c in contexts), kv_len=kv_len)


def hybrid(decodes: int, context: int, q: int, c: int) -> Shape:
    """`decodes` decode rows at `context`, plus a mid-prompt chunk of q tokens on c cached ones (not sampled:
    Sarathi-style chunks mostly end before the prompt does)."""
    return Shape("hybrid", tuple(Seg(1, context, decode=True) for _ in range(decodes))
                 + (Seg(q, c, sample=False),))


def packed_prompts(lengths: list[int]) -> Shape:
    return Shape("prefill", tuple(Seg(n) for n in lengths), note="packed")


def padded_prompts(lengths: list[int]) -> Shape:
    return Shape("padded_prefill", tuple(Seg(n) for n in lengths), note="padded")


def dense_padded_prompts(lengths: list[int]) -> Shape:
    """hf-padded's prefill: right-padded rows under an explicit padding mask (dense L x L blocks)."""
    return Shape("padded_prefill", tuple(Seg(n) for n in lengths), note="dense", dense=True)


def binpacked_prompts(lengths: list[int]) -> Shape:
    """Prepacking's prefill: the prompts First-Fit-Decreasing into rows of the longest."""
    bins = first_fit_decreasing(lengths, max(lengths))
    return Shape("binpacked_prefill", tuple(Seg(n) for n in lengths), bins=tuple(tuple(b) for b in bins))


def padded_insertion(contexts: list[int], prompt: int, width: int) -> Shape:
    """Baton's insertion: running rows (cached `contexts`, each at most `width`) padded to a newcomer's
    `prompt` tokens, every row reading width + prompt KV columns under a dense mask."""
    segs = tuple(Seg(1, c, decode=True) for c in contexts) + (Seg(prompt),)
    return Shape("padded_insertion", segs, kv_len=width + prompt)


def spread(batch: int, kv: int) -> list[int]:
    """Contexts of `batch` decode rows spread evenly from kv/8 to kv - 1 (their KV lengths up to kv)."""
    return np.linspace(max(kv // 8, 1), kv - 1, batch).astype(int).tolist()


def tile_boundaries(lo_exp: int, hi_exp: int) -> list[int]:
    """Token counts on both sides of each power of two 2^lo .. 2^hi: 2^k - 1, 2^k, 2^k + 1 and 2^k + 2 (a step
    between 2^k and 2^k + 1 still has a knot past it when one of the two rows past it is held out)."""
    return [n for k in range(lo_exp, hi_exp + 1) for n in (2 ** k - 1, 2 ** k, 2 ** k + 1, 2 ** k + 2)]


def prompt_sets(batches: list[int], lo: int, hi: int, seed: int) -> list[list[int]]:
    """Seeded sets of prompt lengths (uniform in [lo, hi]) timed both packed and padded."""
    rng = np.random.default_rng(seed)
    return [sorted(rng.integers(lo, hi + 1, size=b).tolist(), reverse=True) for b in batches]
