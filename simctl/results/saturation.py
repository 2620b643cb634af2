"""A run's saturation verdict: `stable`, `backlogged` or `overloaded`, from the waiting queue's trend and the
offered vs served rate. It refines `simctl.results.metrics.unsustainable_reason` and never contradicts it:

- overloaded: the run is unsustainable (that function's rules: it gave up, the queue kept growing, the
  replica admitted or served at under half the offered rate);
- backlogged: sustainable, but a queue built up: the waiting queue seen by the last quarter of arrivals is
  more than 1.5x (plus 2) that seen by the second quarter, or the last half of arrivals found more than 8
  requests waiting on average (a standing queue: the same noise margin as the sustainability rules), or the
  replica served under 80% of the offered rate (served: completions per second between the first and the
  last completion, which a queue stretches);
- too short to judge: the served-rate rule fired, but the run is too short for it to mean anything: fewer
  than 16 requests, or arrivals that span less than 4x the P99 service time (first scheduled to last token).
  A stable run's completions span its arrivals plus the service time of the last requests, so a long-output
  tail alone can stretch them by 1/0.8 - 1 = 1/4 of the arrivals' span, which is what the 80% rule calls a
  backlog (e.g. 50 ShareGPT requests at 2 QPS: 23 s of arrivals, 22 s requests, a queue never above 2). The
  factor 4 is SERVED_SHARE / (1 - SERVED_SHARE), not a tuned number. Only that rule's verdict is withheld:
  an observed queue is a backlog however short the run, and a short run that shows nothing wrong stays
  stable, so every verdict the rule did not give (the goldens') is unchanged. A capacity search counts it as
  a miss, as it did the backlog (`simctl.results.slo`: the probe needs more requests);
- stable: none of these;
- offline batch: every request arrived at the same instant (a throughput benchmark's workload): no rate was
  offered, so none was kept up with or outrun, and the run serves the whole batch (`serving.loop`).
"""

from __future__ import annotations

import numpy as np

STABLE, BACKLOGGED, OVERLOADED, TOO_SHORT = "stable", "backlogged", "overloaded", "too short to judge"
OFFLINE = "offline batch"
GROWTH, GROWTH_MARGIN = 1.5, 2.0
STANDING_QUEUE = 8.0
SERVED_SHARE = 0.8
MIN_TREND = 16  # arrivals below which no queue trend can show
SHORT_SPAN = SERVED_SHARE / (1 - SERVED_SHARE)  # arrival spans per P99 service time a judgement needs


def served_rate(completions: np.ndarray) -> float | None:
    """Completions per second between the first and the last one (None for fewer than two, or one instant)."""
    if len(completions) < 2:
        return None
    span = float(completions.max() - completions.min())
    return (len(completions) - 1) / span if span > 0 else None


def too_short(arrivals: np.ndarray, service_s: np.ndarray) -> str | None:
    """Why a run is too short to judge (see the module docstring), or None: `arrivals` are every request's
    arrival times, `service_s` the completed requests' times from first scheduled to last token."""
    if len(arrivals) < MIN_TREND:
        return f"{len(arrivals)} requests, under the {MIN_TREND} a queue's trend needs"
    if len(service_s) == 0:
        return None
    span = float(arrivals.max() - arrivals.min())
    p99 = float(np.percentile(service_s, 99))
    if span < SHORT_SPAN * p99:
        return (f"the arrivals span {span:.3g} s, under {SHORT_SPAN:g}x the P99 service time ({p99:.3g} s): "
                "long requests alone could make the served rate look short")
    return None


def verdict(queue_at_arrival: np.ndarray, offered_qps: float | None, served_rps: float | None,
            unsustainable: str | None, short: str | None = None) -> tuple[str, str | None]:
    """(verdict, why) for a run; `why` is None for a stable run. `short`: why the run is too short for the
    served-rate rule (`too_short`), None for a run long enough."""
    if unsustainable is not None:
        return OVERLOADED, unsustainable
    q = queue_at_arrival
    n = len(q)
    if n >= MIN_TREND:
        second, last = float(q[n // 4: n // 2].mean()), float(q[3 * n // 4:].mean())
        if last > GROWTH * second + GROWTH_MARGIN:
            return BACKLOGGED, (f"the waiting queue grew: {second:.1f} requests on average in the second "
                                f"quarter of arrivals, {last:.1f} in the last")
        standing = float(q[n // 2:].mean())
        if standing > STANDING_QUEUE:
            return BACKLOGGED, (f"a standing queue: {standing:.1f} requests waiting on average in the last "
                                "half")
    if offered_qps is not None and served_rps is not None and served_rps < SERVED_SHARE * offered_qps:
        served = f"served {served_rps:.3g} requests/s of {offered_qps:.3g} offered"
        return (BACKLOGGED, served) if short is None else (TOO_SHORT, f"{served}, but {short}")
    return STABLE, None
