"""What happens once an iteration has run, whoever ran it: every scheduled `Seq` caches its new tokens, token
times are stamped, token gaps and the iteration row are recorded, and sequences that sampled their last token
are released through `policy.finish`. The simulator, the real engine and the replay all call this, so the
bookkeeping exists once."""

from __future__ import annotations

import numpy as np

from simctl.policies.base import Policy
from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Seq
from simctl.serving.records import Records


def apply_iteration(policy: Policy, records: Records, plan: BatchPlan, start: float, end: float) -> list[Seq]:
    """Apply one executed iteration of `plan`, which began at `start` and whose tokens were sampled at `end`.
    Returns the sequences that finished (already released)."""
    # previous token time (before `start`) -> sequences sampling now, for TBT
    prev_token: dict[float, int] = {}
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


def apply_stretch(policy: Policy, records: Records, plan: BatchPlan, start: float, ends: np.ndarray,
                  kv_used: list[int] | None = None) -> list[Seq]:
    """Apply `len(ends)` back-to-back repeats of a plan (the i-th ends at `ends[i]`): the same outcome as
    `apply_iteration` once per repeat, with the bookkeeping batched. A decode-only plan is recorded as one
    iteration row with a count; a plan with mid-prompt chunks (`kv_used`: the KV held during each repeat) as
    one row per repeat, as stepping records it."""
    k = len(ends)
    first_end, last_end = float(ends[0]), float(ends[-1])
    prev_token: dict[float, int] = {}
    finished: list[Seq] = []
    later = 0  # rows whose previous token came before `start` (as in apply_iteration)
    nd = plan.decode_tokens
    decodes = plan.seqs if kv_used is None else plan.seqs[:nd]
    steps = ends[1:] - ends[:-1]  # every decode's gaps after its first
    inner = float(steps.max()) if k > 1 else 0.0
    lead = max(first_end - start, inner)  # the longest gap of a row whose previous token came at `start`
    for s in decodes:  # k decode steps, each samples a token
        s.computed += k
        g = s.generated = s.generated + k
        t = s.last_token_s
        if t != start:
            prev_token[t] = prev_token.get(t, 0) + 1
            later += 1
            gap = max(first_end - t, inner)
        else:
            gap = lead
        if gap > s.max_gap_s:  # noqa: PLR1730 - a compare costs less than max() in this per-row loop
            s.max_gap_s = gap
        s.last_token_s = last_end
        if g == s.output_tokens:
            s.completion_s = last_end
            finished.append(s)
    rows = None
    if kv_used is None:  # later steps: every decode row waited one iteration
        records.gaps.extend(steps, len(decodes))
    else:
        for s, q in zip(plan.seqs[nd:], plan.num_new[nd:]):  # k chunks, none reaching the prompt's last token
            if s.first_scheduled_s < 0:
                s.first_scheduled_s = start
            s.computed += k * q
        if decodes:  # binned one by one, as stepping these iterations did
            for gap in steps.tolist():
                records.gaps.add(gap, len(decodes))
        t = ends.tolist()
        rows = ([start] + t[:-1], t, kv_used)
    _close(policy, records, plan, start, last_end, k, prev_token, len(decodes) - later, finished, first_end,
           rows)
    return finished


def _close(policy: Policy, records: Records, plan: BatchPlan, start: float, end: float, k: int,
           prev_token: dict[float, int], consecutive: int, finished: list[Seq], first_end: float,
           rows: tuple[list[float], list[float], list[int]] | None = None) -> None:
    """Record the TBT gaps ending at the first of `k` iterations (`consecutive` rows had their previous token
    at `start`, the others at the times `prev_token` counts), release the finished sequences and log one
    iteration row (`k` iterations from `start` to `end`), or `rows`: the starts, ends and KV held of each."""
    gaps = records.gaps
    if consecutive:
        gaps.add(first_end - start, consecutive)
    for t, n in prev_token.items():
        gaps.add(first_end - t, n)
    kv_used = policy.kv.used
    for s in finished:
        policy.finish(s)
    log = records.iterations
    if rows is None:
        log.add(start, end - start, k, plan.prefill_tokens, plan.decode_tokens, len(plan.seqs),
                plan.linear_tokens, kv_used)
        return
    log.add_each(*rows, plan.prefill_tokens, plan.decode_tokens, len(plan.seqs), plan.linear_tokens)
