"""The open-loop part of a vLLM profile's served stage: what served vLLM pays per request beyond its steps.

Requests arriving one by one cost served vLLM more than their steps: each is taken in by the front end
(`AsyncLLM.generate`: input processing, IPC to the engine core, whose input thread decodes it) and its output
sent back, on the core the engine core's scheduling shares (the model worker has the other). Neither the
profiled steps (requests added between timed steps) nor closed batches (every request taken in at once,
before the first step) pay it as a stream does: served at 0.5-0.9 of capacity, vLLM's steps that admitted a
request lasted ~0.6 ms more per admitted request than their profiled price, and steps during which requests
arrived ~0.3 ms more per arrival (quiet 2-core CPU, tiny; regression over the validation's steps).

So the served stage (`profiler.vllm_served.served_stage`) also serves a stream (`time_stream`):
STREAM_REQUESTS requests of the closed batches' shape, Poisson arrivals at STREAM_LOAD x the closed batches'
best throughput, so the engine stays busy and its makespan is the sum of its steps plus what the requests
cost beyond them. `simctl fit` prices the same arrivals with the twin (`vllm-v1` on the served engine's
settings, the calibrated step terms) and puts the makespan's residual per request, as `admitted_s` of
`costs.overheads.StepOverheads` (charged in the step that first schedules the request): `admitted_overhead`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from common.errors import InputError
from costs.fitted import Fitted
from traces.request import Request

STREAM_REQUESTS = 200
STREAM_LOAD = 1.25  # arrival rate over the closed batches' throughput: a queue builds, the engine never idles
FIT_ROUNDS = 4  # fixed-point rounds of the admitted term (makespan is ~linear in it while the engine is busy)


def stream_requests(arrivals: list[float], prompt: int, outputs: int) -> list[Request]:
    return [Request(i, a, prompt, outputs) for i, a in enumerate(arrivals)]


def time_stream(server: Any, throughput: float, prompt: int, outputs: int, seed: int) -> dict[str, Any]:
    """Serve the stream on `server` (a started `engine.vllm_real.VLLMServer`); what `simctl fit` needs."""
    from results.metrics import summarize

    gaps = np.random.default_rng(seed).exponential(1 / (STREAM_LOAD * throughput), STREAM_REQUESTS)
    arrivals = np.cumsum(gaps) - gaps[0]
    run = server.serve(stream_requests(arrivals.tolist(), prompt, outputs), seed)
    return {"arrivals_s": arrivals.round(6).tolist(), "prompt": prompt, "outputs": outputs,
            "makespan_s": summarize(run.result)["makespan_s"], "engine": server.settings()}


def simulated_makespan(cost: Fitted, stream: dict[str, Any]) -> float:
    """The twin's makespan of the stream, on the served engine's settings."""
    from engine.real import twin_policy
    from results.metrics import summarize
    from sim.simulate import simulate

    settings = stream["engine"]
    policy = twin_policy({**settings, "kv_capacity_tokens": settings["kv_cache_tokens"],
                          "max_seq_len": settings["max_model_len"]})
    requests = stream_requests(stream["arrivals_s"], stream["prompt"], stream["outputs"])
    return summarize(simulate(requests, policy, cost))["makespan_s"]


def with_admitted(cost: Fitted, admitted_s: float) -> Fitted:
    """`cost` (its step terms calibrated) charging `admitted_s` per admitted request."""
    data = cost.to_json()
    steps = data["step_overheads"]
    data["step_overheads"] = {**steps, "admitted_s": admitted_s,
                              "source": steps["source"].split("; ")[0] + "; a stream of requests"}
    return Fitted.from_json(data)


def admitted_overhead(cost: Fitted, stream: Any) -> tuple[float, float]:
    """(admitted_s, the twin's makespan without it): the per-request term that makes `cost` (its step terms
    calibrated) price the served stream's makespan, >= 0."""
    if not isinstance(stream, dict) or not {"arrivals_s", "prompt", "outputs", "makespan_s", "engine"} <= set(
            stream):
        raise InputError("served_stream must hold arrivals_s, prompt, outputs, makespan_s and engine")
    served, n = float(stream["makespan_s"]), len(stream["arrivals_s"])
    base = simulated_makespan(cost, stream)
    admitted = max(0.0, (served - base) / n)
    for _ in range(FIT_ROUNDS - 1):
        if admitted == 0:
            break
        priced = simulated_makespan(with_admitted(cost, admitted), stream)
        admitted = max(0.0, admitted + (served - priced) / n)
    return admitted, base
