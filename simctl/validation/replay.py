"""The replay of a real run's iterations: the same policy re-plans every logged iteration through the replica
loop (`serving.replay.LoggedRun`), each plan priced by the cost model next to its measured duration (point 4
of `simctl.validation.validate`), and the per-iteration evidence drawn from it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from simctl.costs.base import CostModel
from simctl.policies.base import Policy
from simctl.policies.plan import BatchPlan, Layout
from simctl.policies.seq import Seq
from simctl.serving.records import GapHistogram
from simctl.validation.twin import twin_inputs, twin_policy


@dataclass
class Replay:
    frame: pd.DataFrame  # one row per replayed iteration: measured and predicted duration, shape, terms
    gaps: GapHistogram  # the real run's token gaps (from the real times)
    matched: int  # iterations whose replayed plan matched the logged one
    total: int  # iterations logged
    between_s: float  # measured time between iterations while work was pending (sampling, bookkeeping)
    between_n: int



def _kind(plan: BatchPlan) -> str:
    if plan.layout is Layout.PADDED:
        return "padded_prefill" if plan.prefill_q else "padded_decode"
    if not plan.prefill_q:
        return "decode"
    return "hybrid" if plan.decode_rows else "prefill"



def replay_real(summary: dict[str, Any], iterations: pd.DataFrame, cost: CostModel,
                requests: pd.DataFrame | None = None) -> Replay:
    """Re-plan the real run's iterations and price each plan (see the module docstring, point 4); a closed
    loop's requests arrive when they were sent (`requests`: its requests table). A
    disaggregated run (`requests` again) is replayed pool by pool: the prefill instance's copies
    at their arrivals, then the decode instance's requests when its loop took them (`kv_taken_s`), with their
    prompts cached and their first token at their KV's arrival; its frame gets a `pool` column."""
    from simctl.serving.handoff import arrivals, arrive_with_kv

    reqs, policy = twin_inputs(summary)
    disaggregated = bool(summary.get("prefill_instances"))
    served = arrivals(reqs, disaggregated)
    if not disaggregated:
        if requests is not None and (summary.get("concurrency") is not None or any(r.previous >= 0
                                                                                    for r in reqs)):
            # closed loop: a request arrived when its client sent it, which the run's table recorded
            sent = requests.set_index("request_id")["arrival_s"]
            for seq in served.entering:
                seq.arrival_s = float(sent[seq.id])
            return _replay(sorted(served.entering, key=lambda seq: seq.arrival_s), policy, iterations, cost)
        return _replay(served.entering, policy, iterations, cost)
    pools = iterations["pool"]
    prefill = _replay(served.entering, policy, iterations[pools == "prefill"], cost)
    copies = {c.id: c for c in served.entering}
    by_id = requests.set_index("request_id")
    taken, arrived = by_id["kv_taken_s"], by_id["first_token_s"]
    crossed = sorted((s for s in served.crossing.values() if taken[s.id] >= 0), key=lambda s: taken[s.id])
    for s in crossed:
        arrive_with_kv(s, copies[s.id], float(arrived[s.id]))
        s.arrival_s = float(taken[s.id])  # due when the decode loop was handed it
    decode = _replay(crossed, twin_policy(summary), iterations[pools == "decode"], cost)
    decode.gaps.merge(prefill.gaps)
    frame = pd.concat([prefill.frame.assign(pool="prefill"), decode.frame.assign(pool="decode")],
                      ignore_index=True)
    return Replay(frame, decode.gaps, prefill.matched + decode.matched, prefill.total + decode.total,
                  prefill.between_s + decode.between_s, prefill.between_n + decode.between_n)


def _replay(seqs: list[Seq], policy: Policy, iterations: pd.DataFrame, cost: CostModel) -> Replay:
    from simctl.serving.inbox import Inbox
    from simctl.serving.loop import Replica
    from simctl.serving.replay import LoggedRun

    rows: list[dict[str, Any]] = []

    def price(plan: BatchPlan, start: float, real_s: float) -> None:
        terms = cost.breakdown(plan) if hasattr(cost, "breakdown") else {}
        ctx = [q.computed + 1 for q in plan.seqs[:plan.decode_tokens]] if plan.layout is Layout.PACKED else []
        rows.append({"start_s": start, "real_s": real_s, "predicted_s": cost.iteration_time(plan),
                     "kind": _kind(plan), "batch_size": len(plan.seqs), "linear_tokens": plan.linear_tokens,
                     "sampled_tokens": plan.sampled_tokens, "prefill_tokens": plan.prefill_tokens,
                     "decode_tokens": plan.decode_tokens, "decode_rows": plan.decode_rows,
                     "segments": len(plan.prefill_q),
                     "decode_kv": plan.decode_kv, "decode_ctx_min": min(ctx, default=0),
                     "decode_ctx_max": max(ctx, default=0), **{f"term_{k}_s": v for k, v in terms.items()}})

    log = LoggedRun(iterations, price)
    inbox = Inbox(seqs)
    replica = Replica(policy, log, log, inbox)
    log.watch(policy, inbox)
    log.drive(replica.serve())
    return Replay(pd.DataFrame(rows), replica.records.gaps, log.matched, len(iterations), log.between_s,
                  log.between_n)



def merge_replays(reps: list[Replay]) -> Replay:
    """The replays of several repeats of one run as one (frames stacked with a `repeat` column, gaps
    pooled)."""
    gaps = GapHistogram()
    for r in reps:
        gaps.merge(r.gaps)
    frame = pd.concat([r.frame.assign(repeat=k) for k, r in enumerate(reps, 1)], ignore_index=True)
    return Replay(frame, gaps, sum(r.matched for r in reps), sum(r.total for r in reps),
                  sum(r.between_s for r in reps), sum(r.between_n for r in reps))



def iteration_evidence(rep: Replay, forward_s: float | None, sim_iterations: pd.DataFrame, repeats: int = 1
                       ) -> dict[str, Any]:
    """Busy-time totals (per real run: the mean over `repeats` pooled in `rep`) and per-kind ratios, measured
    / predicted, from a replay. `forward_s`: the real runs' total forward time, if known."""
    f = rep.frame
    real_busy = float(f["real_s"].sum()) / repeats if len(f) else 0.0
    pred_busy = float(f["predicted_s"].sum()) / repeats if len(f) else 0.0
    sim_busy = float(sim_iterations["duration_s"].sum())
    out: dict[str, Any] = {
        "repeats": repeats,
        "iterations": rep.total,
        "replay_matched": rep.matched,
        "real_busy_s": real_busy,
        "repriced_busy_s": pred_busy,  # the cost model over the real run's own plans
        "sim_busy_s": sim_busy,  # the twin simulation's own iterations
        "busy_ratio_real_over_repriced": real_busy / pred_busy if pred_busy > 0 else None,
        "busy_ratio_real_over_sim": real_busy / sim_busy if sim_busy > 0 else None,
        # inside the iterations: forward
        "real_forward_s": None if forward_s is None else forward_s / repeats,
        "real_in_iteration_overhead_s": (real_busy - forward_s / repeats
                                         if forward_s is not None and rep.matched == rep.total
                                         else None),  # drain arrivals + schedule + inputs, per iteration
        "real_between_s": rep.between_s / repeats,  # argmax + bookkeeping between back-to-back iterations
        "real_between_mean_s": rep.between_s / rep.between_n if rep.between_n else None,
        "sim_iterations": int(sim_iterations["count"].sum()),
        "kinds": {},
    }
    if len(f):
        ratio = f["real_s"] / f["predicted_s"]
        for kind, g in f.groupby("kind"):
            out["kinds"][kind] = _ratios(g, ratio[g.index])
        dec = f[(f["kind"] == "decode") & (f["decode_tokens"] >= 2)]
        if len(dec):  # the profile timed decode batches of equal contexts only
            ragged = dec["decode_ctx_min"] < dec["decode_ctx_max"]
            out["decode_uniform_ctx"] = _ratios(dec[~ragged],
                                                ratio[dec[~ragged].index]) if (~ragged).any() else None
            out["decode_ragged_ctx"] = _ratios(dec[ragged],
                                               ratio[dec[ragged].index]) if ragged.any() else None
        out["decode_excess"] = _excess(f[f["kind"].isin(["decode", "padded_decode"])],
                                       {"per_row_ms": f["decode_rows"]})
        out["prefill_excess"] = _excess(f[f["prefill_tokens"] > 0],
                                        {"per_100_prefill_ms": f["prefill_tokens"] / 100})
    return out



def _ratios(g: pd.DataFrame, r: pd.Series) -> dict[str, Any]:
    return {"n": len(g), "real_s": float(g["real_s"].sum()), "predicted_s": float(g["predicted_s"].sum()),
            "ratio_total": float(g["real_s"].sum() / g["predicted_s"].sum()), "ratio_p50": float(r.median()),
            "real_p50_s": float(g["real_s"].median()), "predicted_p50_s": float(g["predicted_s"].median())}



def _excess(g: pd.DataFrame, features: dict[str, pd.Series]) -> dict[str, Any] | None:
    """Least squares of (measured - predicted) in ms on a constant and `features` over the rows of `g`: what
    the cost model misses per unit of each (None with fewer than 10 rows or no spread)."""
    if len(g) < 10:
        return None
    X = np.column_stack([np.ones(len(g))] + [v[g.index].to_numpy(dtype=float) for v in features.values()])
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return None
    y = (g["real_s"] - g["predicted_s"]).to_numpy() * 1e3
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return {"n": len(g), "const_ms": float(coef[0]), **{k: float(c) for k, c in zip(features, coef[1:])}}

