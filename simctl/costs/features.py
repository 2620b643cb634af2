"""The features a cost model is fitted on and prices, derived from a plan's execution shape in one place: the
plan builders compute the plan's fields, `plan_features` the profile columns (profiler/shapes.py describes
every profiled shape with it, so a model fitted on profile.csv prices plans by the same numbers)."""

from __future__ import annotations

from simctl.costs.graph_buckets import GraphShapes
from simctl.policies.plan import BatchPlan, Layout

FEATURES = ("batch_size", "linear_tokens", "sampled_tokens", "num_segments", "attn_units", "attn_kv_tokens",
            "decode_rows", "decode_kv", "decode_pad_kv", "eager_step")


def decode_pad_kv(plan: BatchPlan) -> int:
    """KV tokens of padding to the longest decode row: decode_rows x (longest context + 1) - decode_kv, for a
    ragged plan that lists its decode sequences (first in `plan.seqs`, as every builder puts them); 0 for
    padded layouts (their decode_kv already counts the padding) and for plans without the sequences."""
    n = plan.decode_rows
    if n <= 1 or plan.layout is Layout.PADDED or len(plan.seqs) < n:
        return 0
    longest = max(s.computed for s in plan.seqs[:n])
    return max(n * (longest + 1) - plan.decode_kv, 0)


def plan_features(plan: BatchPlan, graphs: GraphShapes | None = None) -> dict[str, int | float]:
    """A plan's profile columns (see profiler/shapes.py for what each means), as an executor replaying
    decode graphs of `graphs` runs it (None: an eager executor): a graphed step padded to its graph, any
    other step marked `eager_step`."""
    eager_step = 0
    if graphs is not None:
        run = graphs.executed(plan)
        eager_step = int(run is plan)
        plan = run
    return {"batch_size": len(plan.seqs), "linear_tokens": plan.linear_tokens,
            "sampled_tokens": plan.sampled_tokens, "num_segments": len(plan.prefill_q),
            "attn_units": float(sum(q * (c + (q if plan.dense_attention else q / 2))
                                    for q, c in zip(plan.prefill_q, plan.prefill_c))),
            "attn_kv_tokens": sum(q + c for q, c in zip(plan.prefill_q, plan.prefill_c)),
            "decode_rows": plan.decode_rows, "decode_kv": plan.decode_kv,
            "decode_pad_kv": decode_pad_kv(plan), "eager_step": eager_step}
