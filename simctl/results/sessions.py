"""A run's sessions (`simctl.traces.sessions`): how many, their turns, how long each took from its first
turn's send to its last turn's completion, and the median TTFT by turn index (a later turn resends its
context, which the prefix cache may hold)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

TTFT_TURNS = 4  # turns reported by `ttft_p50_by_turn`: the first few, where most sessions still are


def session_summary(req: Mapping[str, np.ndarray]) -> dict[str, Any] | None:
    """The summary's `sessions` block from a requests table (`serving.records.request_columns`), None for a
    run without sessions. A session's duration counts only sessions whose every turn completed."""
    if "session" not in req:
        return None
    inside = req["session"] >= 0
    ids, session = np.unique(req["session"][inside], return_inverse=True)
    sent, done = req["arrival_s"][inside], req["completion_s"][inside]
    turns = np.bincount(session, minlength=len(ids))
    start = np.full(len(ids), np.inf)
    np.minimum.at(start, session, sent)
    end = np.full(len(ids), -np.inf)
    np.maximum.at(end, session, done)
    complete = np.bincount(session, weights=done >= 0, minlength=len(ids)) == turns
    durations = (end - start)[complete]
    ttft = req["first_token_s"][inside] - sent
    turn = req["turn"][inside]
    served = [ttft[(turn == k) & (done >= 0)] for k in range(TTFT_TURNS)]
    by_turn = [float(np.median(t)) if len(t) else None for t in served]
    return {
        "num_sessions": len(ids),
        "completed_sessions": int(complete.sum()),
        "turns_per_session_mean": float(turns.mean()) if len(ids) else 0.0,
        "turns_per_session_max": int(turns.max()) if len(ids) else 0,
        "session_duration_p50": float(np.percentile(durations, 50)) if len(durations) else None,
        "session_duration_p90": float(np.percentile(durations, 90)) if len(durations) else None,
        "ttft_p50_by_turn": by_turn,
    }
