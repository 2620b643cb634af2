"""Serving metrics from a run's records, named as vLLM's benchmark names them.

TTFT: arrival to first token. TBT: every gap between consecutive tokens of a request, pooled over requests
(P99 over all gaps, as Sarathi-Serve reports it). TPOT: per request, (E2E - TTFT) / (output tokens - 1).
E2E: arrival to last token. Scheduling delay: arrival to first scheduled. Request-level percentiles use
linear interpolation (numpy's default, as vLLM's benchmark); TBT percentiles are read off a histogram of all
gaps (records.GapHistogram) with the inverted CDF, to 0.006%.
"""

from __future__ import annotations

import numpy as np

from sim.simulate import SimResult

PCTS = (50, 90, 99)


def _pcts(name: str, values: np.ndarray, pcts: tuple[int, ...] = PCTS) -> dict[str, float | None]:
    if len(values) == 0:
        return {f"{name}_p{p}": None for p in pcts}
    return {f"{name}_p{p}": float(v) for p, v in zip(pcts, np.percentile(values, pcts))}


def queue_grows(queue_at_arrival: np.ndarray) -> bool:
    """Whether the waiting queue keeps growing over the run: the last quarter of arrivals sees clearly more
    waiting requests than the second quarter did (a steady state has no such trend; overload grows
    linearly). A heuristic; its threshold of 8 keeps Poisson noise at light load from tripping it."""
    n = len(queue_at_arrival)
    if n < 16:
        return False
    second = queue_at_arrival[n // 4: n // 2].mean()
    last = queue_at_arrival[3 * n // 4:].mean()
    return bool(last > 2 * second + 8)


def _offered_rate(arrivals: np.ndarray) -> float | None:
    """Requests per second the trace offered: what --qps asked for, or a replayed trace's real rate."""
    span = float(arrivals.max() - arrivals.min()) if len(arrivals) > 1 else 0.0
    return (len(arrivals) - 1) / span if span > 0 else None


def summarize(result: SimResult) -> dict[str, float | int | bool | None]:
    req = result.requests
    done = req[req["completion_s"] >= 0]
    arrival = done["arrival_s"].to_numpy()
    first = done["first_token_s"].to_numpy()
    end = done["completion_s"].to_numpy()
    outputs = done["output_tokens"].to_numpy()
    ttft = first - arrival
    e2e = end - arrival
    multi = outputs > 1
    tpot = (end[multi] - first[multi]) / (outputs[multi] - 1)
    sched = req["first_scheduled_s"].to_numpy()
    sched_delay = (sched - req["arrival_s"].to_numpy())[sched >= 0]
    tbt = dict(zip((f"tbt_p{p}" for p in PCTS), result.gaps.percentiles(PCTS)))
    makespan = float(end.max() - req["arrival_s"].min()) if len(done) else 0.0
    its = result.iterations
    return {
        "num_requests": len(req),
        "completed": len(done),
        **_pcts("ttft", ttft),
        **tbt,
        "tpot_p50": float(np.median(tpot)) if len(tpot) else None,
        **_pcts("e2e", e2e),
        **_pcts("sched_delay", sched_delay),
        "throughput_rps": len(done) / makespan if makespan > 0 else 0.0,
        "throughput_tokens_per_s": float(outputs.sum()) / makespan if makespan > 0 else 0.0,
        "total_tokens_per_s": float(outputs.sum() + done["prompt_tokens"].sum()) / makespan
        if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "offered_qps": _offered_rate(req["arrival_s"].to_numpy()),
        "preemptions": int(req["preemptions"].sum()),
        "iterations": its.iterations,
        "kv_capacity_tokens": int(result.kv_capacity),
        "kv_peak_tokens": int(max(its.kv_used)) if len(its.kv_used) else 0,
        "sustainable": not result.aborted and not queue_grows(result.queue_at_arrival),
        "sim_wall_s": result.wall_s,
    }
