"""What happens once an iteration has run, whoever ran it: every scheduled `Seq` caches its new tokens, token
times are stamped, token gaps and the iteration row are recorded, and sequences that sampled their last token
are released through `policy.finish`. The simulator, the real engine and the replay all call this, so the
bookkeeping exists once."""

from __future__ import annotations

import numpy as np

from policies.base import Policy
from policies.plan import BatchPlan
from policies.seq import Seq
from serving.records import Records


def apply_iteration(policy: Policy, records: Records, plan: BatchPlan, start: float, end: float) -> list[Seq]:
    """Apply one executed iteration of `plan`, which began at `start` and whose tokens were sampled at `end`.
    Returns the sequences that finished (already released)."""
    prev_token: dict[float, int] = {}  # previous token time (before `start`) -> sequences sampling now, for TBT
    finished: list[Seq] = []
    nd = plan.decode_tokens
    seqs = plan.seqs
    later = 0  # decodes whose previous token came before this iteration's start (the rare case)
    span = end - start
    for s in seqs[:nd]:  # decodes: Seq.advance(1), inlined on the hot path; each samples a token
        s.computed += 1
        g = s.generated = s.generated + 1
        t = s.last_token_s
        if t != start:
            prev_token[t] = prev_token.get(t, 0) + 1
            later += 1
            s.max_gap_s = max(s.max_gap_s, end - t)
        elif span > s.max_gap_s:
            s.max_gap_s = span
        s.last_token_s = end
        if g == s.output_tokens:
            s.completion_s = end
            finished.append(s)
    for s, q in zip(seqs[nd:], plan.num_new[nd:]):  # prefill segments
        if s.first_scheduled_s < 0:
            s.first_scheduled_s = start
        if not s.advance(q):
            continue  # a chunk short of the last known token samples nothing
        if s.first_token_s < 0:
            s.first_token_s = end
        else:  # re-prefilled after a preemption: the user saw a long gap
            prev_token[s.last_token_s] = prev_token.get(s.last_token_s, 0) + 1
            s.max_gap_s = max(s.max_gap_s, end - s.last_token_s)
        s.last_token_s = end
        if s.generated == s.output_tokens:
            s.completion_s = end
            finished.append(s)
    _close(policy, records, plan, start, end, 1, prev_token, nd - later, finished, end)
    return finished


def apply_stretch(policy: Policy, records: Records, plan: BatchPlan, start: float, ends: np.ndarray) -> list[Seq]:
    """Apply `len(ends)` back-to-back repeats of a decode-only plan (the i-th ends at `ends[i]`): the same
    outcome as `apply_iteration` once per repeat, with the bookkeeping batched."""
    k = len(ends)
    first_end, last_end = float(ends[0]), float(ends[-1])
    prev_token: dict[float, int] = {}
    finished: list[Seq] = []
    later = 0  # rows whose previous token came before `start` (as in apply_iteration)
    steps = ends[1:] - ends[:-1]  # every row's gaps after its first
    inner = float(steps.max()) if k > 1 else 0.0
    for s in plan.seqs:  # k decode steps, each samples a token
        s.computed += k
        s.generated += k
        t = s.last_token_s
        if t != start:
            prev_token[t] = prev_token.get(t, 0) + 1
            later += 1
        s.max_gap_s = max(s.max_gap_s, first_end - t, inner)
        s.last_token_s = last_end
        if s.generated == s.output_tokens:
            s.completion_s = last_end
            finished.append(s)
    records.gaps.extend(steps, len(plan.seqs))  # later steps: every row waited one iteration
    _close(policy, records, plan, start, last_end, k, prev_token, len(plan.seqs) - later, finished, first_end)
    return finished


def _close(policy: Policy, records: Records, plan: BatchPlan, start: float, end: float, k: int,
           prev_token: dict[float, int], consecutive: int, finished: list[Seq], first_end: float) -> None:
    """Record the TBT gaps ending at the first of `k` iterations (`consecutive` rows had their previous token
    at `start`, the others at the times `prev_token` counts), release the finished sequences and log one
    iteration row (`k` iterations from `start` to `end`)."""
    gaps = records.gaps
    if consecutive:
        gaps.add(first_end - start, consecutive)
    for t, n in prev_token.items():
        gaps.add(first_end - t, n)
    kv_used = policy.kv.used
    for s in finished:
        policy.finish(s)
    records.iterations.add(start, end - start, k, plan.prefill_tokens, plan.decode_tokens, len(plan.seqs),
                           plan.linear_tokens, kv_used)
