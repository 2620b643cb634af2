"""The fitted cost model's functional form (`costs/fitted.py: Fitted` prices one plan with it, the fit and
its figure evaluate it over arrays with `predict_arrays`).

Functional form (seconds per iteration; every quantity is a field of the `BatchPlan`):

    t = overhead_s
      + linear(tiled(T))                                           linear layers (T > 0)
      + lm_head(tiled(r))                                          LM head (r > 0)
      + attn_unit_s x sum_i q_i (c_i + q_i/2)                      prefill attention compute (q_i (c_i + q_i)
                                                                   for dense-masked blocks)
      + attn_kv_token_s x sum_i (c_i + q_i)                        prefill attention KV read
      + attn_segment_s x (number of prefill segments)              per-segment launches
      + decode_rows x (decode_row_s + decode_kv(decode_kv / decode_rows))   decode attention, per row
      + decode_pad_token_s x decode_pad_kv                         ... and padding to the longest row
      + eager_step_s x eager_step                                  a step launched eagerly beside graphs

with T = `linear_tokens` (padding included), r = `sampled_tokens` (LM-head rows), segments i =
(`prefill_q`, `prefill_c`), decode_kv / decode_rows the mean KV tokens a decode row reads (its context + 1,
padding included), decode_pad_kv = `decode_pad_kv(plan)` (below), and tiled(n) = n for n <= tile, else n
rounded up to a multiple of the fitted `tile` (as `Roofline.tiled`: a GEMM over more than one row tile pays
for whole tiles; below one tile the kernels use smaller tiles or GEMV).

`linear`, `lm_head` and `decode_kv` are monotone piecewise-linear curves given by knot tables [(n_0, s_0),
(n_1, s_1), ...] (n strictly increasing, s non-decreasing, >= 0): linear interpolation between knots, the
last segment's slope beyond the last knot, s_0 below the first, 0 at a count of 0. The linear table starts
at (1, 0): the linear layers' cost at one token is part of `overhead_s` (every iteration has T >= 1, so the
two could not be told apart). The LM head table starts at (0, 0), so its first segment is the first sampled
row's cost (identified by profiled shapes that sample nothing, e.g. mid-prompt chunks). The decode table
starts at (k_0, 0) with k_0 the shortest mean KV length profiled: `decode_row_s` is a row's cost there, and
shorter rows are priced as k_0 (a row's cost below it cannot be told from the per-row constant).

Why this form:
- Measured linear-layer time against T is not a line nor a soft knee on every device. On a 2-core CPU
  (tiny model, 2 OpenMP threads) it is ~2.3 ms at T = 1 (GEMV, one thread), ~5 ms at T = 2 (GEMM: the
  second thread is woken for every operator), nearly flat to T = 16, a step between T = 128 and 129 (the
  GEMM changes its partitioning), then close to linear: no closed form with a few coefficients follows that
  (the previous sqrt(mem^2 + (per_token x T)^2) form fitted this CPU at 14% held-out error). A GPU shows a
  weight-streaming floor blending into a compute slope (a convex knee) plus tile steps. A monotone
  piecewise-linear curve with knots where the profile measured covers both, keeps the form linear in its
  parameters (the fit is a non-negative least squares: non-negative increments between knots make the curve
  monotone), and is exact at the measured token counts.
- Tile quantization stays a fitted parameter (selected among powers of two): a GPU's step at every tile
  boundary cannot be represented by knots placed only where the profile measured, but it is by evaluating
  the curves at tiled counts (Sarathi-Serve measured chunk 257 up to 32% slower than 256). A one-off step
  (the CPU's at 128/129) is a knot pair instead, with the tile left at 1.
- Attention is priced from what it does: compute ~ q(c + q/2) per segment (a varlen kernel; padded or
  dense-masked layouts arrive as segments of the padded length, so pads are paid), KV read ~ (c + q), and a
  per-segment cost. The profile CSV holds only these sums, so they enter linearly.
- Decode attention is memory-bound, but its cost per KV token is not constant: on the CPU a row reading 2048
  KV tokens cost ~30% more per token than one reading 512 (the SDPA kernel blocks the KV length), which
  left a batch x context pattern of -8%..+5% residuals with a single slope. A per-row curve of the mean KV
  length follows it (decode_kv(x) = (x - k_0) x slope when it is a line: the previous form).
  Non-linearity in the batch size lands in the linear/LM-head curves, which decode rows evaluate at
  T = r = batch size.
- Decode rows of different contexts in a ragged batch: decode_pad_kv = decode_rows x (longest context + 1)
  - decode_kv is the KV a batch padded to its longest row would read beyond its own (0 when all contexts are
  equal, and for padded layouts, whose decode_kv already counts it). An executor that batches decode rows
  into padded groups pays part of it: the profiler's (`executor/ragged.py`) groups rows within a factor 2
  of context and masks the rest, and its mixed-context decode steps took 10-20% longer than their mean
  context predicts (tiny on a 2-core CPU; fitted: ~0.6 of a KV token's cost per padding token). The fitted
  share is a property of the executor profiled (an exact varlen kernel fits it at ~0).
- A fixed overhead (launches, Python, sampling, and the linear layers at one token) absorbs everything
  independent of the batch.
- An executor that replays decode steps from CUDA graphs (`costs/graph_buckets.py`) still launches every
  other step kernel by kernel from Python: `eager_step` is 1 for those steps of such an executor (0 for its
  graphed decodes, and for every step of an eager one, whose launches `overhead_s` holds). Measured on an
  H200 (mistral-7b, bfloat16; `bench/results/gpu_h200.md`): graphed decode steps 7.6-11 ms, eager prompts of
  16 to 512 tokens 25-39 ms, host-bound; one shared overhead priced the prompts at a third of that.
- Step overheads (`step_overheads`, `costs/overheads.py`): host terms per step, per scheduled request and
  per sampled token, and an eager launch floor, added as the roofline adds them. A fit of whole profiled
  steps has them inside `overhead_s` and the per-row terms (its file has no `step_overheads`: all zero); a fit
  of operator profiles (`profiler/fit_operators.py`), whose kernels were timed without a host, takes its
  execution mode's defaults. `tp`: the tensor-parallel degree the times are per GPU of (all-reduces
  included), 1 unless written.

All coefficients are >= 0 and the curves non-decreasing, so the time never decreases when a field of the
plan grows (tile rounding is a step, never a drop).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simctl.costs.curves import pwl_array, tiled_array

# The scalar coefficients, in the order the fit and `predict_arrays` use.
COEFFICIENTS: tuple[str, ...] = (
    "overhead_s",  # s per iteration (the linear layers at T = 1 included)
    "attn_unit_s",  # s per q (c + q/2) of prefill segments
    "attn_kv_token_s",  # s per (c + q) of prefill segments
    "attn_segment_s",  # s per prefill segment
    "decode_pad_token_s",  # s per KV token of padding to the longest decode row (ragged layouts)
    "decode_row_s",  # s per decode row (reading one KV token)
    "eager_step_s",  # s per step launched eagerly by an executor that replays decode graphs
)
# coefficients a cost_model.json written before them may lack: they price at 0 there
OPTIONAL_COEFFICIENTS: tuple[str, ...] = ("eager_step_s",)
# The piecewise-linear curves: name -> (what their n counts, the first knot's n; None: the smallest n
# profiled)
CURVES: dict[str, tuple[str, int | None]] = {
    "linear": ("tiled linear tokens T", 1),
    "lm_head": ("tiled sampled rows r", 0),
    "decode_kv": ("mean KV tokens per decode row, decode_kv / decode_rows", None),
}

FORM = ("t = overhead_s + linear(tiled(T))[T>0] + lm_head(tiled(r))[r>0] + attn_unit_s*sum q(c+q/2) "
        "+ attn_kv_token_s*sum(c+q) + attn_segment_s*segments "
        "+ decode_rows*(decode_row_s + decode_kv(decode_kv/decode_rows)) + decode_pad_token_s*decode_pad_kv; "
        "+ eager_step_s*eager_step; "
        "decode_pad_kv = decode_rows*(longest decode context+1) - decode_kv (ragged layouts; 0 padded); "
        "eager_step = 1 for a step an executor replaying decode graphs launches eagerly, else 0; "
        "linear, lm_head, decode_kv: monotone piecewise-linear through their knots (last slope beyond the "
        "last knot); tiled(n) = n if n <= tile else ceil(n/tile)*tile")


def predict_arrays(coef: dict[str, float] | np.ndarray, curves: dict[str, Sequence[tuple[float, float]]],
                   tile: int, linear_tokens, sampled_tokens, attn_units, attn_kv_tokens, num_segments,
                   decode_rows, decode_kv, decode_pad_kv=0, eager_step=0) -> np.ndarray:
    """The functional form over arrays of plan fields (the fit and reports use it; `Fitted` prices the same
    formula one plan at a time). `curves`: the knot tables by name (`CURVES`)."""
    c = (np.array([coef.get(k, 0.0) if k in OPTIONAL_COEFFICIENTS else coef[k] for k in COEFFICIENTS],
                  dtype=np.float64) if isinstance(coef, dict) else np.asarray(coef, dtype=np.float64))
    T = tiled_array(linear_tokens, tile)
    r = tiled_array(sampled_tokens, tile)
    rows = np.asarray(decode_rows, dtype=np.float64)
    mean_kv = np.asarray(decode_kv, dtype=np.float64) / np.maximum(rows, 1.0)
    return (c[0] + pwl_array(T, curves["linear"]) + pwl_array(r, curves["lm_head"])
            + c[1] * np.asarray(attn_units, dtype=np.float64)
            + c[2] * np.asarray(attn_kv_tokens, dtype=np.float64)
            + c[3] * np.asarray(num_segments, dtype=np.float64)
            + c[4] * np.asarray(decode_pad_kv, dtype=np.float64)
            + rows * (c[5] + pwl_array(mean_kv, curves["decode_kv"]))
            + c[6] * np.asarray(eager_step, dtype=np.float64))
