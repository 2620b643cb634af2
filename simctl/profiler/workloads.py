"""The grids a profile times: which shapes (`profiler.shapes`), how many repetitions, in how many sweeps.

Grids (`GRID_NAMES`): `full` (a CPU profile of `tiny` in under 5 minutes), `quick` (under a minute) and `test`
(seconds, for the test suite). All cap token positions at the model's `max_position` and skip shapes whose KV
slab would exceed the memory budget the caller gives. What the full grid is for (the fitted form is
`simctl.costs.fitted_form`'s: piecewise-linear curves with knots where the profile measured):

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

The CPU profile shipped in `profiler/profiles/cpu/` (2026-11-22) predates three of these kinds (Baton's
insertions, bin-packed and dense padded prefills): its fit prices them by extrapolation, with mean errors of
3.7-5.3% on a 2026-11-23 profile's measurements of them (`bench/results/profile_new_shapes.md`).

How a shape's repetitions run is `profiler.shape_protocol`'s (`served` by default, `fixed`); how each shape
is timed (sweeps, quiet blocks, the estimate) is `profiler/worker.py`'s docstring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simctl.catalogue.moe import MoE, expected_distinct_experts
from simctl.costs.graph_buckets import GraphShapes
from simctl.profiler.shape_protocol import SERVED, Repetitions, ShapeProtocol
from simctl.profiler.shapes import (
    Shape,
    binpacked_prompts,
    decode,
    decode_mixed,
    dense_padded_prompts,
    hybrid,
    packed_prompts,
    padded_decode,
    padded_insertion,
    padded_prompts,
    prefill,
    prompt_sets,
    spread,
    tile_boundaries,
)

GRID_NAMES = ("full", "quick", "test")


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
    protocol: ShapeProtocol = SERVED
    max_position: int = 0
    max_kv_tokens: int | None = None
    graphs: GraphShapes | None = None  # decode steps replay CUDA graphs

    def repetitions(self) -> list[Repetitions]:
        """Each shape's calls under the grid's protocol, in shape order; a shape that replays a CUDA graph
        repeats itself (a graph has one shape: nothing keyed on the KV length is left to defeat, and moving
        its rows would capture other graphs while timed)."""
        return [Repetitions(s, 0, 0) if self._graphed(s) else
                self.protocol.repetitions(s, self.max_position, self.max_kv_tokens) for s in self.shapes]

    def _graphed(self, shape: Shape) -> bool:
        plan = shape.plan()
        return self.graphs is not None and self.graphs.executed(plan) is not plan

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


UNION_LEFT = 0.1  # experts the union may still lack where the grid stops adding token counts


def expert_union_tokens(moe: MoE, most: int = 16) -> list[int]:
    """Token counts at which a mixture of experts' union of routed experts grows: 1, 2, ... up to where the
    expected distinct experts under uniform routing come within UNION_LEFT of all of them (at most `most`):
    the linear-layer curve needs knots there, as its weight reads follow the union (`simctl.catalogue.moe`).
    Within a tenth of an expert, not half: each expert a step adds cost tiny-moe 1.2 ms on this project's
    2-core CPU (decode of 8 rows 10.1 ms, of 10 rows 11.3 ms, 0.95 experts apart), so half an expert left
    out was ~5% of a step, and served decodes of 11-16 rows, between the grid's last union knot (10) and 16,
    ran ~4% further above their price than the other decodes (`bench/results/validate_moe.md`)."""
    ts = [1]
    while (ts[-1] < most and expected_distinct_experts(moe.experts, moe.experts_per_token, ts[-1])
           < moe.experts - UNION_LEFT):
        ts.append(ts[-1] + 1)
    return ts


@dataclass(slots=True)
class _Layouts:
    """Shapes a grid times in several layouts: prompt sets (packed, padded causal and dense-masked,
    bin-packed), Baton's insertions (rows, width, prompt) and padded vs ragged decode steps (rows, KV)."""

    sets: list[list[int]]
    inserts: list[tuple[int, int, int]]
    padded_decodes: list[tuple[int, int]]


def _full(top: int, seed: int) -> tuple[Grid, _Layouts]:
    tile_hi = int(np.log2(top))
    ts = sorted(set(_dense_prefill(top)) | set(tile_boundaries(3, tile_hi)))
    shapes = [prefill(t) for t in ts if t <= top]
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
    grid = Grid("full", shapes, warmup=1, min_reps=10, max_reps=160, budget_s=1.0, passes=16,
                quiet_blocks=5, max_wall_s=275.0)
    return grid, _Layouts(sets, inserts, pd)


def _quick(top: int, seed: int) -> tuple[Grid, _Layouts]:
    ts = [1, 2, 16, 64, 127, 128, 129, 256, 512, 1024]
    shapes = [prefill(t) for t in ts if t <= top]
    chunks = ((128, 512, True), (512, 1024, True), (128, 1024, False))
    shapes += [prefill(q, c, sample=s) for q, c, s in chunks if c + q <= top]
    shapes += [decode(b, c) for b in (1, 8, 32) for c in (128, 1024) if c < top]
    shapes += [hybrid(d, 512, q, 0) for d in (8, 32) for q in (128, 512)]
    grid = Grid("quick", shapes, warmup=1, min_reps=6, max_reps=60, budget_s=0.8, passes=6, quiet_blocks=3,
                max_wall_s=45.0)
    return grid, _Layouts(prompt_sets([4, 16], 16, 384, seed), [(4, 512, 128)], [(32, 512)])


def _test(top: int, seed: int) -> tuple[Grid, _Layouts]:
    shapes = [prefill(8), prefill(17), prefill(8, 16), prefill(4, 8, sample=False), decode(2, 16),
              hybrid(2, 16, 8, 8)]
    grid = Grid("test", shapes, warmup=1, min_reps=2, max_reps=2, budget_s=0.0)
    return grid, _Layouts(prompt_sets([3], 4, 12, seed), [(2, 16, 8)], [(2, 24)])


_GRIDS = {"full": _full, "quick": _quick, "test": _test}


def _add_expert_knots(grid: Grid, moe: MoE, top: int) -> None:
    """Single prompts and decode batches of every token count over which `moe`'s union of experts grows."""
    union = expert_union_tokens(moe)
    have = {s.segs[0].q for s in grid.shapes if s.kind == "prefill" and len(s.segs) == 1 and not s.segs[0].c}
    grid.shapes += [prefill(t) for t in union if t not in have and t <= top]
    have = {s.slots for s in grid.shapes if s.kind == "decode" and s.segs[0].c == 128}
    grid.shapes += [decode(b, 128) for b in union if b not in have and 128 < top]


def _add_layouts(grid: Grid, layouts: _Layouts, top: int) -> None:
    for lengths in layouts.sets:
        lengths = [min(n, top) for n in lengths]
        grid.shapes += [packed_prompts(lengths), padded_prompts(lengths), dense_padded_prompts(lengths),
                        binpacked_prompts(lengths)]
        grid.prompt_sets.append(lengths)
    for b, width, n in layouts.inserts:
        width = min(width, top - n)
        grid.shapes.append(padded_insertion(spread(b - 1, width) if b > 1 else [], n, width))
    for b, kv in layouts.padded_decodes:
        kv = min(kv, top)
        # contexts spread from kv/8 to kv-1: the padded step reads b x kv columns, the ragged one masks them
        contexts = spread(b, kv)
        grid.shapes += [padded_decode(contexts, kv), decode_mixed(contexts), padded_decode([kv - 1] * b, kv)]


def build_grid(name: str, max_position: int, max_kv_tokens: int | None = None, seed: int = 0,
               protocol: ShapeProtocol = SERVED, moe: MoE | None = None,
               graphs: GraphShapes | None = None) -> Grid:
    """The shapes of grid `name`, with positions capped at `max_position` and KV slabs at `max_kv_tokens`;
    `protocol` says how their repetitions run (the shapes do not depend on it), `graphs` whether decode
    steps replay CUDA graphs. A mixture of experts (`moe`) adds single prompts and decode batches of every
    token count over which its union of experts grows."""
    if name not in GRID_NAMES:
        raise ValueError(f"unknown grid {name!r}; choose one of {', '.join(GRID_NAMES)}")
    top = min(max_position, 2048)  # longest sequence profiled
    grid, layouts = _GRIDS[name](top, seed)
    if moe is not None and name != "test":  # expert-union growth: knots at every token count it spans
        _add_expert_knots(grid, moe, top)
    _add_layouts(grid, layouts, top)
    grid.protocol, grid.max_position, grid.max_kv_tokens = protocol, max_position, max_kv_tokens
    grid.graphs = graphs
    kept = []
    for s in grid.shapes:
        if s.max_len > max_position or (max_kv_tokens is not None and s.kv_tokens > max_kv_tokens):
            grid.skipped.append(s.label())
        else:
            kept.append(s)
    grid.shapes = kept
    return grid
