"""The served-mode calibration of a vLLM profile: what served vLLM pays per step beyond the profiled steps.

`simctl profile --engine vllm` times vLLM's steps with the engine core in the profiler's process, stepped one
at a time (`profiler/vllm_worker.py`); its model worker runs as serving runs it. The served stage runs in a
child of its own, started after that one ended (`python -m profiler.vllm_worker --stage served`): run in the
grid's process after its engine shut down, closed batches of 1-16 requests were served 0.6-0.8 ms a step
slower than the same batches served from a fresh process (measured), which the fit took for a host cost.
Served vLLM (`AsyncLLM`, as `simctl real --engine vllm` runs it) adds what sits around those steps: the engine
core in a process of its own that sends each step's outputs to the front end over IPC, and the front end's
request intake and output processing, which share the engine core's core. Its child starts
that served engine (the settings `simctl real --engine vllm` uses by default) and serves closed batches: B
requests of the same prompt arriving at once (`time_served`). The steps where all B decode are read from the
engine's own step log (`engine.vllm_steps`): the period between consecutive steps' outputs is the served
step's time (`ServedStep`), with the model execution inside it as the engine core times it.

Then lone requests, each arriving at the idle engine, time its front end (`time_admission`): from arrival to
the engine core's first scheduling of the request, 1.2-1.9 ms here (the client's wake-up, vLLM's input
processing, the hand-over to the engine core's process); the fit keeps the median as
`StepOverheads.admission_s`.

`simctl fit` then prices each such step with the model fitted to the grid and fits the residual, served minus
fitted, as the host terms of `costs.overheads.StepOverheads` (`served_overheads`): one non-negative least
squares on relative residuals of `iteration_s + request_s x B`. In a decode step every scheduled request
samples one token, so the per-request and per-sampled-token terms cannot be told apart: the fit puts them per
request (`sampled_token_s` stays 0).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np
from scipy.optimize import nnls

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.costs.fitted import Fitted
from simctl.costs.overheads import StepOverheads

if TYPE_CHECKING:
    from simctl.engine.vllm_real import VLLMServer
    from simctl.policies.plan import BatchPlan

SERVED_PROMPT = 192  # prompt tokens of every request of a closed batch
SERVED_OUTPUTS = 40  # output tokens: 39 decode steps a batch
ADMISSIONS = 40  # lone requests timed from arrival to first scheduling (`time_admission`)
ADMISSION_GAP_S = 0.05  # between their arrivals: each finds the engine idle (a step here takes < 20 ms)


@dataclass(frozen=True, slots=True)
class ServedStep:
    """A served decode step of `batch` requests at `context` (computed tokens each, its median step)."""

    batch: int
    context: int
    time_s: float  # median period between consecutive steps' outputs (what a served step costs)
    model_s: float  # median model execution in those steps, as vLLM's engine core times it
    steps: int  # decode steps measured (over the repeats)

    @classmethod
    def from_json(cls, data: Any) -> ServedStep:
        fields = cls.__dataclass_fields__
        if not isinstance(data, dict) or set(data) != set(fields):
            raise InputError(f"served_steps: each entry must have exactly {', '.join(fields)}")
        step = cls(**data)
        if not (isinstance(step.batch, int) and step.batch >= 1 and isinstance(step.context, int)
                and step.context >= 1 and isinstance(step.time_s, (int, float)) and step.time_s > 0):
            raise InputError(f"served_steps: batch and context must be integers >= 1 and time_s > 0, got "
                             f"{data}")
        return step


def decode_periods(ends: np.ndarray, all_decode: np.ndarray) -> np.ndarray:
    """Periods of the steps that decode the whole batch and follow one that did: end minus previous end."""
    ok = all_decode[1:] & all_decode[:-1]
    return np.diff(ends)[ok]


def time_served(server: VLLMServer, batches: tuple[int, ...], repeats: int) -> list[ServedStep]:
    """Serve closed batches of each size in `batches`, `repeats` times, on `server` (a started
    `simctl.engine.vllm_real.VLLMServer`; see the module docstring); one `ServedStep` per size."""
    from simctl.traces.request import Request

    out = []
    for batch in batches:
        periods, model_s = [], []
        for _ in range(repeats):
            run = server.serve([Request(i, 0.0, SERVED_PROMPT, SERVED_OUTPUTS) for i in range(batch)])
            it = run.result.iterations.frame()
            all_decode = ((it.decode_tokens == batch) & (it.prefill_tokens == 0)).to_numpy()
            periods.extend(decode_periods((it.start_s + it.duration_s).to_numpy(), all_decode))
            model_s.extend(it.duration_s.to_numpy()[1:][all_decode[1:] & all_decode[:-1]])
        if not periods:
            raise RuntimeError(f"served vLLM never decoded a batch of {batch} in one step")
        out.append(ServedStep(batch, SERVED_PROMPT + SERVED_OUTPUTS // 2 - 1, float(np.median(periods)),
                              float(np.median(model_s)), len(periods)))
    return out


def time_admission(server: VLLMServer) -> list[float]:
    """The front end's admission latency on `server` (see `costs.overheads.StepOverheads.admission_s`): lone
    requests, each arriving at an idle engine, from arrival to their first scheduling as the engine core
    stamps it (on this clock; its scheduler takes a request in and schedules it within ~10 us, measured)."""
    from simctl.traces.request import Request

    requests = [Request(i, ADMISSION_GAP_S * (i + 1), SERVED_PROMPT, 2) for i in range(ADMISSIONS)]
    frame = server.serve(requests).result.requests
    return sorted(float(x) for x in frame.first_scheduled_s - frame.arrival_s)


def served_stage(model: str, dtype: str, grid: str, seed: int, out: TextIO) -> None:
    """The served stage of `grid` as a profiling child (the worker's protocol on `out`): a start event, then
    done with meta holding `served_steps`, the request stream's steps (`served_stream`, and what was run,
    `served_stream_info`; `simctl.profiler.vllm_stream`) and `served_s`."""
    from simctl.engine.vllm_real import VLLMServer, vllm_args_for
    from simctl.profiler.vllm_grid import vllm_grid
    from simctl.profiler.vllm_stream import time_stream

    g = vllm_grid(grid)
    t0 = time.perf_counter()
    out.write(json.dumps({"event": "start", "shapes": len(g.served), "total": len(g.served), "skipped": []})
              + "\n")
    with VLLMServer(model, vllm_args_for(model, seed, {}, dtype)) as server:
        steps = time_served(server, g.served, g.served_repeats)
        admissions = time_admission(server)
        stream, info = time_stream(server, seed) if g.stream else ([], {})
    meta = {"served_steps": served_json(steps), "served_admission_s": admissions,
            "served_stream": [s.to_json() for s in stream], "served_stream_info": info,
            "served_s": round(time.perf_counter() - t0, 3)}
    out.write(json.dumps({"event": "done", "meta": {**meta, "wall_s": meta["served_s"]}}) + "\n")
    out.flush()


def decode_plan(batch: int, context: int) -> BatchPlan:
    """The plan of a step decoding `batch` requests of `context` computed tokens each."""
    from simctl.policies.plan import packed
    from simctl.policies.seq import Seq

    seqs = []
    for i in range(batch):
        s = Seq(i, 0.0, SERVED_PROMPT, SERVED_OUTPUTS)
        s.computed, s.generated, s.first_scheduled_s = context, context - SERVED_PROMPT + 1, 0.0  # running
        seqs.append(s)
    return packed(seqs, [1] * batch)


def served_overheads(cost: CostModel, steps: list[ServedStep]) -> StepOverheads:
    """The host terms that make `cost` price the served steps: NNLS of the relative residuals (served -
    `cost`'s price) on a per-step and a per-request term."""
    if not steps:
        raise InputError("served_steps: no served step to calibrate on")
    t = np.array([s.time_s for s in steps])
    predicted = np.array([cost.iteration_time(decode_plan(s.batch, s.context)) for s in steps])
    x = np.column_stack([np.ones(len(steps)), [s.batch for s in steps]]) / t[:, None]
    (per_step, per_request), _ = nnls(x, (t - predicted) / t)
    batches = ", ".join(str(s.batch) for s in steps)
    return StepOverheads("eager", float(per_step), float(per_request), 0.0, 0.0,
                         f"served calibration: closed decode batches of {batches} through AsyncLLM")


def admission(meta: dict[str, Any]) -> float:
    """The median of a profile's admission latencies (meta.json's `served_admission_s`; 0 without)."""
    raw = meta.get("served_admission_s") or []
    if not (isinstance(raw, list) and all(isinstance(x, (int, float)) and 0 <= x < 1 for x in raw)):
        raise InputError("served_admission_s must be a list of latencies in seconds, each in [0, 1)")
    return float(np.median(raw)) if raw else 0.0


def served_json(steps: list[ServedStep]) -> list[dict[str, Any]]:
    return [asdict(s) for s in steps]


def calibrate(cost: Fitted, meta: dict[str, Any]) -> tuple[Fitted, list[dict[str, float]]]:
    """`cost` with the host terms of its profile's served steps (meta.json's `served_steps`; unchanged
    without) and, where the profile served a request stream (`served_stream`), the per-request term fitted
    to it (`profiler.vllm_stream.fit_stream`, on the model with the closed batches' terms); and one row per
    served step: its batch, served, profiled and calibrated prices (ms)."""
    raw = meta.get("served_steps") or []
    if not isinstance(raw, list):
        raise InputError("served_steps must be a list")
    steps = [ServedStep.from_json(d) for d in raw]
    if not steps:
        return cost, []
    overheads = replace(served_overheads(cost, steps), admission_s=admission(meta))
    calibrated = _with(cost, overheads)
    stream = meta.get("served_stream") or []
    if not isinstance(stream, list):
        raise InputError("served_stream must be a list")
    if stream:
        from simctl.profiler.vllm_stream import StreamStep, fit_stream

        fit = fit_stream(calibrated, [StreamStep.from_json(d) for d in stream])
        overheads = replace(overheads, new_request_s=fit.new_request_s,
                            new_request_token_s=fit.new_request_token_s, source=(
            f"{overheads.source}; request stream: {fit.steps} served steps, {fit.per_new_s * 1e6:.0f} us per "
            f"newly scheduled request + {fit.per_prefill_token_s * 1e6:.2f} us per its prompt token + "
            f"{fit.per_arrival_s * 1e6:.0f} us per arrival during a step, charged at the request's first "
            f"step (controls, not charged: {fit.per_step_s * 1e6:.0f} us per step, {fit.per_row_s * 1e6:.1f} "
            "us per row)"))
        calibrated = _with(cost, overheads, {"served_stream_fit": asdict(fit)})
    rows = [{"batch": s.batch, "context": s.context, "served_ms": s.time_s * 1e3, "model_ms": s.model_s * 1e3,
             "profile_ms": cost.iteration_time(decode_plan(s.batch, s.context)) * 1e3,
             "calibrated_ms": calibrated.iteration_time(decode_plan(s.batch, s.context)) * 1e3}
            for s in steps]
    return calibrated, rows


def _with(cost: Fitted, overheads: StepOverheads, fit: dict[str, Any] | None = None) -> Fitted:
    data = cost.to_json()
    data["step_overheads"] = overheads.to_json()
    if fit:
        data["fit"] = {**data.get("fit", {}), **fit}
    return Fitted.from_json(data)
