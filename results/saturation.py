"""A run's saturation verdict: `stable`, `backlogged` or `overloaded`, from the waiting queue's trend and the
offered vs served rate. It refines `results.metrics.unsustainable_reason` and never contradicts it:

- overloaded: the run is unsustainable (that function's rules: it gave up, the queue kept growing, the
  replica admitted or served at under half the offered rate);
- backlogged: sustainable, but a queue built up: the waiting queue seen by the last quarter of arrivals is
  more than 1.5x (plus 2) that seen by the second quarter, or the last half of arrivals found more than 8
  requests waiting on average (a standing queue: the same noise margin as the sustainability rules), or the
  replica served under 80% of the offered rate (served: completions per second between the first and the
  last completion, which a queue stretches);
- stable: none of these.
"""

from __future__ import annotations

import numpy as np

STABLE, BACKLOGGED, OVERLOADED = "stable", "backlogged", "overloaded"
GROWTH, GROWTH_MARGIN = 1.5, 2.0
STANDING_QUEUE = 8.0
SERVED_SHARE = 0.8


def served_rate(completions: np.ndarray) -> float | None:
    """Completions per second between the first and the last one (None for fewer than two, or one instant)."""
    if len(completions) < 2:
        return None
    span = float(completions.max() - completions.min())
    return (len(completions) - 1) / span if span > 0 else None


def verdict(queue_at_arrival: np.ndarray, offered_qps: float | None, served_rps: float | None,
            unsustainable: str | None) -> tuple[str, str | None]:
    """(verdict, why) for a run; `why` is None for a stable run."""
    if unsustainable is not None:
        return OVERLOADED, unsustainable
    q = queue_at_arrival
    n = len(q)
    if n >= 16:
        second, last = float(q[n // 4: n // 2].mean()), float(q[3 * n // 4:].mean())
        if last > GROWTH * second + GROWTH_MARGIN:
            return BACKLOGGED, (f"the waiting queue grew: {second:.1f} requests on average in the second "
                                f"quarter of arrivals, {last:.1f} in the last")
        standing = float(q[n // 2:].mean())
        if standing > STANDING_QUEUE:
            return BACKLOGGED, (f"a standing queue: {standing:.1f} requests waiting on average in the last "
                                "half")
    if offered_qps is not None and served_rps is not None and served_rps < SERVED_SHARE * offered_qps:
        return BACKLOGGED, f"served {served_rps:.3g} requests/s of {offered_qps:.3g} offered"
    return STABLE, None
