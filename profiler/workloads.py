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
- reps, time_s, time_p10_s, time_p90_s: repetitions used, their median and 10th/90th percentile seconds
  (which repetitions: `profiler/worker.py`)

Every shape builds its plan with the policies' plan builders (`Shape.plan`) and its columns come from
`costs.features.plan_features(plan)`: the features exist in one place.

Grids (`GRID_NAMES`): `full` (a CPU profile of `tiny` in under 5 minutes), `quick` (under a minute) and `test`
(seconds, for the test suite). All cap token positions at the model's `max_position` and skip shapes whose KV
slab would exceed the memory budget the caller gives. What the full grid is for (the fitted form is
`costs.fitted`'s: piecewise-linear curves with knots where the profile measured):

- single prompts at every power of two, on both sides of each (2^k - 1, 2^k + 1, 2^k + 2: a tile or
  kernel step shows between knots), and densely in between (held-out rows there check the interpolation);
  the decode batch sizes are among them, so the linear-layer curve is pinned where decode rows sample
  every row;
- chunks on cached context (attention compute vs KV read vs segments), half of them mid-prompt chunks
  that sample nothing: with them the LM head's first row is told apart from the fixed overhead;
- long iterations: two full-length prompts packed, and 12 to 32 prompts of 256 tokens (T = 3072 to 8192,
  vLLM's per-iteration token cap for sharegpt): the curve's knots above one prompt's 2048 tokens, so large
  batched and padded prefills interpolate;
- decodes on a batch x context grid, decodes of spread contexts (padded to the longest row by the
  executor), hybrids (decodes + a chunk), prompt sets packed, padded (causal and dense-masked: hf-padded)
  and bin-packed (Prepacking), ragged vs padded decode steps, and Baton's padded insertions (running rows
  padded to a newcomer's prompt over a wide batch).

How a shape's repetitions run is a `ShapeProtocol`: `served` (the default) moves every cached context by a
few tokens from call to call, symmetric around the shape, and its segments over the slab's rows, as serving
does (no cache keyed on the shape stays warm); `fixed` repeats the shape. Either way the row's features are
the nominal shape's. How each shape is timed (sweeps, quiet blocks, the estimate) is `profiler/worker.py`'s
docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from catalogue.moe import MoE, expected_distinct_experts
from costs.features import plan_features
from policies.binpack import first_fit_decreasing
from policies.plan import BatchPlan
from policies.plan import binpacked_prefill as binpacked_prefill_plan
from policies.plan import hybrid as hybrid_plan
from policies.plan import padded_decode as padded_decode_plan
from policies.plan import padded_insertion as padded_insertion_plan
from policies.plan import padded_prefill as padded_prefill_plan
from policies.seq import Seq

Kind = Literal["prefill", "decode", "hybrid", "padded_prefill", "padded_decode", "padded_insertion",
               "binpacked_prefill"]
KINDS: tuple[str, ...] = ("prefill", "decode", "hybrid", "padded_prefill", "padded_decode",
                          "padded_insertion", "binpacked_prefill")
FEATURES = ("kind", "batch_size", "linear_tokens", "sampled_tokens", "num_segments", "attn_units",
            "attn_kv_tokens", "decode_rows", "decode_kv", "decode_pad_kv", "q", "c")
TIMINGS = ("reps", "time_s", "time_p10_s", "time_p90_s")
COLUMNS = FEATURES + TIMINGS
GRID_NAMES = ("full", "quick", "test")


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

    def features(self) -> dict[str, object]:
        plan = self.plan()
        if self.kind == "padded_insertion":  # a newcomer's prompt on the batch's width
            q, c = self.length, plan.kv_len - self.length
        elif self.padded or self.bins:  # the representative chunk and context: a padded row
            q, c = (1, plan.kv_len - 1) if self.kind == "padded_decode" else (self.length, 0)
        else:
            pre = [s for s in self.segs if not s.decode]
            rep = max(pre, key=lambda s: (s.q, s.c)) if pre else None
            q, c = (rep.q, rep.c) if rep else (1, max(s.c for s in self.segs))
        return {"kind": self.kind, **plan_features(plan), "q": q, "c": c}

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


# ---- how a shape's repetitions run -------------------------------------------------------------------------

PROTOCOLS = ("served", "fixed")


@dataclass(frozen=True, slots=True)
class Repetitions:
    """The calls that time one shape: call j runs `shape.shifted(offset(j))` with its segments in the slab
    rows base(j) .. base(j) + slots - 1 (packed, in segment order, as the engine's `SlotPool` keeps them), on
    a slab of `slab` = (rows, positions) that holds every call."""

    shape: Shape
    radius: int  # contexts move within [c - radius, c + radius]
    spare_slots: int  # slab rows beyond the shape's: the first segment's row cycles through 0..spare_slots

    def offset(self, j: int) -> int:
        """0, +1, -1, +2, -2, ..., +radius, -radius, then again: no KV length repeats within 2 radius + 1
        calls, and every odd-length run of calls from the start is symmetric around the nominal shape (an
        even one is half a token above it)."""
        k = j % (2 * self.radius + 1)
        return (k + 1) // 2 if k % 2 else -(k // 2)

    def call(self, j: int) -> tuple[Shape, int]:
        """Call j's shape and the slab row of its first segment."""
        return self.shape.shifted(self.offset(j)), j % (self.spare_slots + 1)

    @property
    def slab(self) -> tuple[int, int]:
        return self.shape.slots + self.spare_slots, self.shape.shifted(self.radius).max_len

    @property
    def kv_tokens(self) -> int:
        slots, max_len = self.slab
        return slots * max_len


@dataclass(frozen=True, slots=True)
class ShapeProtocol:
    """How a shape's repetitions are laid out. `served` (the default) varies them as serving does, so that no
    cache keyed on a shape (an attention plan cache keyed on the KV length, a tensor left hot in a CPU cache
    by the previous call) flatters the profile: every cached context moves by a few tokens from call to call
    (`Repetitions.offset`), within `max_offset` tokens and `offset_share` of the shortest cached context and
    within the model's positions, and the segments' slab rows move by one each call over `spare_slots` extra
    rows; the slab is longer than the shape's KV, as the engine's slab is (so a decode reads a strided view of
    it). The offsets are symmetric around the shape, and time is close to linear in a few tokens of
    context, so the median repetition (`time_s`) is the nominal shape's time and the recorded features
    stay the nominal shape's, which are those of the mean call too (every feature is linear in the
    contexts). `fixed` times the same shape in the same rows every call (the profiler before issue 11), to
    see what the caches give."""

    name: Literal["served", "fixed"] = "served"
    # +-64 tokens: 129 KV lengths before one repeats, most of the calls of a shape (up to max_reps = 160 and a
    # warm-up a block) where contexts allow it (an eighth of 512 tokens and up)
    max_offset: int = 64
    offset_share: float = 0.125
    spare_slots: int = 3

    def __post_init__(self) -> None:
        if self.name not in PROTOCOLS:
            raise ValueError(f"unknown shape protocol {self.name!r}; choose one of {', '.join(PROTOCOLS)}")

    def repetitions(self, shape: Shape, max_position: int, max_kv_tokens: int | None = None) -> Repetitions:
        """`shape`'s calls, within the model's positions and a slab of at most `max_kv_tokens` (the grid's
        budget, which `shape` fits): where the budget is tight the spare rows give way first (the KV lengths
        are what a cache keys on), then the radius, so a shape the fixed protocol times is timed here too
        (`meta.json` lists the ones whose contexts stay fixed)."""
        if self.name == "fixed":
            return Repetitions(shape, 0, 0)
        cached = [s.c for s in shape.segs if s.c]
        radius = min(self.max_offset, int(min(cached) * self.offset_share),
                     max_position - shape.max_len) if cached else 0
        spare = self.spare_slots
        if max_kv_tokens is not None:
            radius = min(radius, max_kv_tokens // shape.slots - shape.max_len)
            spare = min(spare, max_kv_tokens // shape.shifted(max(radius, 0)).max_len - shape.slots)
        return Repetitions(shape, max(radius, 0), max(spare, 0))

    def meta(self) -> dict[str, object]:
        """What meta.json records (`shape_protocol`)."""
        if self.name == "fixed":
            return {"name": "fixed",
                    "description": "every repetition runs the same shape in the same slab rows"}
        return {"name": self.name, "max_offset": self.max_offset, "offset_share": self.offset_share,
                "spare_slots": self.spare_slots,
                "description": "call j moves every cached context (c > 0) and padded KV width by 0, +1, -1, "
                               "+2, -2, ... up to min(max_offset, offset_share x the shortest cached "
                               "context, positions left) tokens, then repeats; its segments take slab rows b "
                               ".. b + n - 1 with b = j mod (spare_slots + 1); features are the nominal "
                               "shape's"}


@dataclass(slots=True)
class Grid:
    name: str
    shapes: list[Shape]
    warmup: int  # untimed calls before a shape's repetitions, in every pass
    min_reps: int
    max_reps: int
    budget_s: float  # timing budget per shape: reps = budget / (time of one call), within [min, max]
    passes: int = 1  # sweeps of the grid: a shape is timed in min(passes, reps) of them (profiler/worker.py)
    # after the sweeps, shapes with fewer blocks timed on an idle machine are re-timed...
    quiet_blocks: int = 0
    max_wall_s: float = math.inf  # ...until they have them or the worker has run this long
    skipped: list[str] = field(default_factory=list)
    prompt_sets: list[list[int]] = field(default_factory=list)
    protocol: ShapeProtocol = ShapeProtocol()
    max_position: int = 0
    max_kv_tokens: int | None = None

    def repetitions(self) -> list[Repetitions]:
        """Each shape's calls under the grid's protocol, in shape order."""
        return [self.protocol.repetitions(s, self.max_position, self.max_kv_tokens) for s in self.shapes]

    def protocol_meta(self) -> dict[str, object]:
        """meta.json's `shape_protocol`: the protocol and, when served, the shapes on cached context whose KV
        lengths stayed fixed (at the model's last position, or a slab at the memory budget)."""
        meta = self.protocol.meta()
        if self.protocol.name == "served":
            meta["unvaried_shapes"] = [r.shape.label() for r in self.repetitions()
                                       if r.radius == 0 and any(s.c for s in r.shape.segs)]
        return meta


def _dense_prefill(max_t: int) -> list[int]:
    dense = [1, 2, 4, 8, *range(16, 256, 16), *range(256, 1024, 64), *range(1024, 4097, 128)]
    return [t for t in dense if t <= max_t]


def expert_union_tokens(moe: MoE, most: int = 16) -> list[int]:
    """Token counts at which a mixture of experts' union of routed experts grows: 1, 2, ... up to where the
    expected distinct experts under uniform routing come within half an expert of all of them (at most
    `most`): the linear-layer curve needs knots there, as its weight reads follow the union
    (`catalogue.moe`)."""
    ts = [1]
    while (ts[-1] < most
           and expected_distinct_experts(moe.experts, moe.experts_per_token, ts[-1]) < moe.experts - 0.5):
        ts.append(ts[-1] + 1)
    return ts


def build_grid(name: str, max_position: int, max_kv_tokens: int | None = None, seed: int = 0,
               protocol: ShapeProtocol = ShapeProtocol(), moe: MoE | None = None) -> Grid:
    """The shapes of grid `name`, with positions capped at `max_position` and KV slabs at `max_kv_tokens`;
    `protocol` says how their repetitions run (the shapes do not depend on it). A mixture of experts (`moe`)
    adds single prompts and decode batches of every token count over which its union of experts grows."""
    if name not in GRID_NAMES:
        raise ValueError(f"unknown grid {name!r}; choose one of {', '.join(GRID_NAMES)}")
    top = min(max_position, 2048)  # longest sequence profiled
    shapes: list[Shape] = []
    if name == "full":
        tile_hi = int(np.log2(top))
        ts = sorted(set(_dense_prefill(top)) | set(tile_boundaries(3, tile_hi)))
        shapes += [prefill(t) for t in ts if t <= top]
        # chunks on cached context; half of them mid-prompt (no LM-head row: tells the LM head from the rest)
        shapes += [prefill(q, c, sample=c in (128, 1024)) for c in (128, 512, 1024, 1536)
                   for q in (32, 128, 256, 512) if c + q <= top]
        # long iterations: two full-length prompts (heavy attention) and many 256-token ones (light attention)
        # up to 8192 tokens (vLLM's token cap for sharegpt), so T > 2048 interpolates between knots
        shapes += [packed_prompts([top, top])]
        shapes += [packed_prompts([min(256, top)] * b) for b in (12, 16, 24, 32)]
        sets = prompt_sets([2, 4, 8, 16], 16, 384, seed)
        sets += [[128] * 8]  # equal lengths: no padding, packed [1, B*L] vs padded [B, L] layouts only
        ctxs = [16, 128, 512, 1024, top - 1]
        shapes += [decode(b, c) for b in (1, 2, 4, 8, 16, 32, 64, 128) for c in ctxs]
        # decode rows of spread contexts (the executor pads every row to the longest): the padding term
        shapes += [decode_mixed(spread(b, kv)) for b in (4, 16, 64) for kv in (128, 512, top)]
        pd = [(b, kv) for b in (8, 32, 128) for kv in (256, 1024)]
        # Baton's insertions: B rows x a newcomer's L tokens over a wide batch (running rows padded to L)
        inserts = [(b, w, n) for b in (2, 4, 8) for w in (256, 1024) for n in (64, 256, 512)]
        shapes += [hybrid(d, 512, q, c) for d in (1, 8, 32, 64) for q in (64, 256, 512) for c in (0, 1024)]
        grid = Grid(name, shapes, warmup=1, min_reps=10, max_reps=160, budget_s=1.0, passes=16,
                    quiet_blocks=5, max_wall_s=275.0)
    elif name == "quick":
        ts = [1, 2, 16, 64, 127, 128, 129, 256, 512, 1024]
        shapes += [prefill(t) for t in ts if t <= top]
        chunks = ((128, 512, True), (512, 1024, True), (128, 1024, False))
        shapes += [prefill(q, c, sample=s) for q, c, s in chunks if c + q <= top]
        sets = prompt_sets([4, 16], 16, 384, seed)
        shapes += [decode(b, c) for b in (1, 8, 32) for c in (128, 1024) if c < top]
        pd = [(32, 512)]
        inserts = [(4, 512, 128)]
        shapes += [hybrid(d, 512, q, 0) for d in (8, 32) for q in (128, 512)]
        grid = Grid(name, shapes, warmup=1, min_reps=6, max_reps=60, budget_s=0.8, passes=6, quiet_blocks=3,
                    max_wall_s=45.0)
    else:  # test
        shapes += [prefill(8), prefill(17), prefill(8, 16), prefill(4, 8, sample=False)]
        sets = prompt_sets([3], 4, 12, seed)
        shapes += [decode(2, 16)]
        pd = [(2, 24)]
        inserts = [(2, 16, 8)]
        shapes += [hybrid(2, 16, 8, 8)]
        grid = Grid(name, shapes, warmup=1, min_reps=2, max_reps=2, budget_s=0.0)
    if moe is not None and name != "test":  # expert-union growth: knots at every token count it spans
        union = expert_union_tokens(moe)
        have = {s.segs[0].q for s in grid.shapes
                if s.kind == "prefill" and len(s.segs) == 1 and not s.segs[0].c}
        grid.shapes += [prefill(t) for t in union if t not in have and t <= top]
        have = {s.slots for s in grid.shapes if s.kind == "decode" and s.segs[0].c == 128}
        grid.shapes += [decode(b, 128) for b in union if b not in have and 128 < top]
    for lengths in sets:
        lengths = [min(n, top) for n in lengths]
        grid.shapes += [packed_prompts(lengths), padded_prompts(lengths), dense_padded_prompts(lengths),
                        binpacked_prompts(lengths)]
        grid.prompt_sets.append(lengths)
    for b, width, n in inserts:
        width = min(width, top - n)
        grid.shapes.append(padded_insertion(spread(b - 1, width) if b > 1 else [], n, width))
    for b, kv in pd:
        kv = min(kv, top)
        # contexts spread from kv/8 to kv-1: the padded step reads b x kv columns, the ragged one masks them
        contexts = spread(b, kv)
        grid.shapes += [padded_decode(contexts, kv), decode_mixed(contexts), padded_decode([kv - 1] * b, kv)]
    grid.protocol, grid.max_position, grid.max_kv_tokens = protocol, max_position, max_kv_tokens
    kept = []
    for s in grid.shapes:
        if s.max_len > max_position or (max_kv_tokens is not None and s.kv_tokens > max_kv_tokens):
            grid.skipped.append(s.label())
        else:
            kept.append(s)
    grid.shapes = kept
    return grid
