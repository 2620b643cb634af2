"""Serving metrics from a run's records, named as vLLM's benchmark names them.

TTFT: arrival to first token. TBT: every gap between consecutive tokens of a request, pooled over requests
(P99 over all gaps, as Sarathi-Serve reports it). TPOT: per request, (E2E - TTFT) / (output tokens - 1).
E2E: arrival to last token. Scheduling delay: arrival to first scheduled. Request-level percentiles use
linear interpolation (numpy's default, as vLLM's benchmark); TBT percentiles are read off a histogram of all
gaps (records.GapHistogram) with the inverted CDF, to 0.006%. `vllm_bench` holds the same metrics under
vLLM's benchmark names and definitions (simctl.results.vllm_bench).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simctl.results.run_result import SimResult
from simctl.results.saturation import OFFLINE, served_rate, too_short, verdict
from simctl.results.sessions import session_summary
from simctl.results.vllm_bench import summary_block

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


def unsustainable_reason(queue_at_arrival: np.ndarray, num_requests: int, gave_up: bool,
                         offered_qps: float | None, served_rps: float) -> str | None:
    """Why the offered load outran the replica, or None if it kept up. Four signs, each with its own reach:
    the run gave up (overload detected while serving); the waiting queue grew over the run (a long run at a
    steady overload); more than half the requests (and more than 8) were still waiting when the last one
    arrived, i.e. the replica admitted them at under half the offered rate; or (16 requests or more) it
    served them at under half the offered rate. A short run is over before a trend shows, and batching admits
    a whole batch at once, so only the last sign catches a short run that admitted quickly but served
    slowly."""
    q = queue_at_arrival
    if gave_up:
        return (f"gave up: {int(q[-1])} requests were waiting at once ({len(q)} of {num_requests} had "
                "arrived); the replica cannot keep up with the offered rate")
    if queue_grows(q):
        n = len(q)
        return (f"the waiting queue keeps growing: {q[n // 4: n // 2].mean():.0f} requests on average in the "
                f"second quarter of arrivals, {q[3 * n // 4:].mean():.0f} in the last")
    if len(q) and q[-1] > max(8, num_requests / 2):
        return (f"{int(q[-1])} of {num_requests} requests were still waiting when the last one arrived: the "
                "replica admitted them at under half the offered rate")
    if len(q) >= 16 and offered_qps is not None and served_rps < offered_qps / 2:
        return (f"served {served_rps:.3g} requests/s of {offered_qps:.3g} offered: the backlog took longer "
                "to drain than the requests took to arrive")
    return None


def _offered_rate(arrivals: np.ndarray) -> float | None:
    """Requests per second the trace offered: what --qps asked for, or a replayed trace's real rate."""
    span = float(arrivals.max() - arrivals.min()) if len(arrivals) > 1 else 0.0
    return (len(arrivals) - 1) / span if span > 0 else None


def summarise_result(result: SimResult) -> dict[str, Any]:
    req = result.request_columns
    all_arrivals = req["arrival_s"]
    done = req["completion_s"] >= 0
    completed = int(done.sum())
    arrival = all_arrivals[done]
    first = req["first_token_s"][done]
    end = req["completion_s"][done]
    outputs = req["output_tokens"][done]
    prompts = req["prompt_tokens"][done]
    ttft = first - arrival
    e2e = end - arrival
    multi = outputs > 1
    tpot = (end[multi] - first[multi]) / (outputs[multi] - 1)
    sched = req["first_scheduled_s"]
    sched_delay = (sched - all_arrivals)[sched >= 0]
    tbt = dict(zip((f"tbt_p{p}" for p in PCTS), result.gaps.percentiles(PCTS)))
    makespan = float(end.max() - all_arrivals.min()) if completed else 0.0
    its = result.iterations
    throughput = completed / makespan if makespan > 0 else 0.0
    offered = _offered_rate(all_arrivals)
    if offered is None and len(all_arrivals) > 1 and not result.aborted:  # all at once: no rate offered
        reason, saturation, saturation_reason = None, OFFLINE, "every request arrived at the same instant"
    else:
        reason = unsustainable_reason(result.queue_at_arrival, len(all_arrivals), result.aborted, offered,
                                      throughput)
        short = too_short(all_arrivals, end - sched[done])
        saturation, saturation_reason = verdict(result.queue_at_arrival, offered, served_rate(end), reason,
                                                short)
    summary = {
        "num_requests": len(all_arrivals),
        "completed": completed,
        **_pcts("ttft", ttft),
        **tbt,
        "tpot_p50": float(np.median(tpot)) if len(tpot) else None,
        **_pcts("tpot", tpot, (90, 99)),
        **_pcts("e2e", e2e),
        **_pcts("sched_delay", sched_delay),
        "throughput_rps": throughput,
        "throughput_tokens_per_s": float(outputs.sum()) / makespan if makespan > 0 else 0.0,
        "total_tokens_per_s": float(outputs.sum() + prompts.sum()) / makespan
        if makespan > 0 else 0.0,
        "makespan_s": makespan,
        "offered_qps": offered,
        "preemptions": int(req["preemptions"].sum()),
        "iterations": its.iterations,
        "kv_capacity_tokens": int(result.kv_capacity),
        "kv_peak_tokens": int(max(its.kv_used)) if len(its.kv_used) else 0,
        "sustainable": reason is None,
        "unsustainable_reason": reason,
        "saturation": saturation,  # stable, backlogged, overloaded or offline batch (results/saturation.py)
        "saturation_reason": saturation_reason,
        "gave_up": result.aborted,
        "sim_wall_s": result.wall_s,
    }
    summary["vllm_bench"] = summary_block(summary, ttft, tpot, e2e, outputs, prompts, end)
    sessions = session_summary(req)
    if sessions is not None:  # a run without sessions keeps its summary as it was
        summary["sessions"] = sessions
    return summary
