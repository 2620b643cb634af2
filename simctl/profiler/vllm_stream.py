"""The request stream of a vLLM profile's served stage: what a request costs served vLLM beyond the steps.

The closed batches of `profiler.vllm_served` price served decode steps, but every request of a served run
also costs the host once: the front end takes it in (its request state, the IPC to the engine core, on the
core the engine core shares) and the engine core adds and first schedules it (its blocks, its state in the
model runner). Closed batches pay that once per batch, before the steps they time; a served run pays it all
along. So the served stage also serves open-loop request streams (`time_stream`; Poisson arrivals of a
trace at fractions of the engine's closed-batch throughput, with another seed than a validation's), recording
which requests every step gave a token (`VLLMServer.serve(members=True)`), and turns each step into a
`StreamStep`: its shape (decode rows' contexts, whole prompts prefilled), the period between its outputs and
the previous step's (what it cost served), the requests it scheduled for the first time, and the requests
submitted while it ran. A step counts only if it continues a busy engine (it decodes a request that ran in
the step before it, so no idle time is in its period) and its shape adds up to the engine's own counts.

`simctl fit` prices each such step with the model fitted to the grid and the closed batches, and regresses
the excess (period - price) on what the step did (`fit_stream`: robust least squares): a per-step and a
per-row term, controls for what the step's price may have wrong, which the twin is not charged; the requests
scheduled for the first time, their prompt tokens, and the requests submitted while it ran. A request is
scheduled for the first time once and submitted once, so the twin, which prices a step before any arrival
during it is known, pays what a request costs in the step that first schedules it: per request the sum of
the per-new-request and per-arrival coefficients (`StepOverheads.new_request_s`), and per prompt token its
coefficient (`new_request_token_s`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.policies.plan import BatchPlan

if TYPE_CHECKING:
    from simctl.engine.vllm_real import VLLMRun, VLLMServer

STREAM_TRACE, STREAM_SCALE = "sharegpt", 0.05  # the lengths of the stream's requests
STREAM_REQUESTS = 200  # requests per stream
# arrival rates, as fractions of the closed-batch throughput (a served engine's capacity under the default SLO
# came 1.2-1.5x that of a closed batch of 64 on the 2-core VM)
STREAM_LOADS = (0.5, 0.9, 1.2)
STREAM_REPEATS = 2  # streams per load
CLOSED_BATCH = 64  # requests of the closed batch whose throughput sets the rates
SEED_OFFSET = 1000  # the streams' requests differ from a validation's (which uses the run's seed)


@dataclass(frozen=True, slots=True)
class StreamStep:
    """One served step of a request stream (see the module docstring)."""

    period_s: float  # its outputs' time minus the previous step's
    decode_contexts: tuple[int, ...]  # each decode row's computed tokens before the step
    prefills: tuple[int, ...]  # each whole prompt prefilled in the step (nothing cached before)
    new: int  # requests scheduled for the first time (their prefills)
    arrivals: int  # requests submitted while it ran (between the previous step's outputs and its own)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any) -> StreamStep:
        fields = cls.__dataclass_fields__
        if not isinstance(data, dict) or set(data) != set(fields):
            raise InputError(f"served_stream: each step must have exactly {', '.join(fields)}")
        ints = [*data["decode_contexts"], *data["prefills"], data["new"], data["arrivals"]]
        period = data["period_s"]
        if not (all(isinstance(x, int) and x >= 0 for x in ints) and isinstance(period, (int, float))
                and period > 0):
            raise InputError(f"served_stream: counts must be integers >= 0 and period_s > 0, got {data}")
        return cls(float(data["period_s"]), tuple(data["decode_contexts"]), tuple(data["prefills"]),
                   data["new"], data["arrivals"])

    def plan(self) -> BatchPlan:
        """The plan the simulator would build for this step (decodes first, then the prompts)."""
        from simctl.policies.plan import packed
        from simctl.policies.seq import Seq

        seqs, num_new = [], []
        for i, c in enumerate(self.decode_contexts):
            s = Seq(i, 0.0, c, c + 2)  # decodes its token on c computed ones: prompt c, 1 generated
            s.computed, s.generated, s.first_scheduled_s = c, 1, 0.0  # scheduled before
            seqs.append(s)
            num_new.append(1)
        for j, p in enumerate(self.prefills):
            s = Seq(len(seqs) + j, 0.0, p, 2)
            seqs.append(s)
            num_new.append(p)
        return packed(seqs, num_new)


def stream_steps(run: VLLMRun, prompts: dict[int, int]) -> tuple[list[StreamStep], int]:
    """The steps of a served run (`VLLMRun` recorded with members) that count (see the module docstring),
    and how many steps did not."""
    it = run.result.iterations.frame()
    if run.members is None or len(run.members) != len(it):
        raise RuntimeError("the run's steps were not recorded with their members")
    ends = (it.start_s + it.duration_s).to_numpy()
    arrivals = np.sort([r.arrival_s for r in run.requests])
    counts = np.searchsorted(arrivals, ends, side="right")
    out: list[StreamStep] = []
    for k in range(1, len(ends)):
        decodes = tuple(prompts[rid] + n - 1 for rid, n in run.members[k] if n > 0)
        fills = tuple(prompts[rid] for rid, n in run.members[k] if n == 0)
        if (decodes and len(decodes) == it.decode_tokens.iat[k] and sum(fills) == it.prefill_tokens.iat[k]
                and ends[k] > ends[k - 1]):
            out.append(StreamStep(float(ends[k] - ends[k - 1]), decodes, fills, len(fills),
                                  int(counts[k] - counts[k - 1])))
    return out, len(ends) - 1 - len(out)


def time_stream(server: VLLMServer, seed: int) -> tuple[list[StreamStep], dict[str, Any]]:
    """Serve the request streams on `server` (a started `engine.vllm_real.VLLMServer`); their counting steps
    and what was run."""
    from dataclasses import replace

    from simctl.results.metrics import summarise_result
    from simctl.traces.build import build_trace

    def requests(qps: float) -> list:
        return build_trace(STREAM_TRACE, STREAM_REQUESTS, qps, seed + SEED_OFFSET, scale=STREAM_SCALE)

    closed = [replace(r, arrival_s=0.0) for r in requests(1.0)[:CLOSED_BATCH]]
    throughput = CLOSED_BATCH / summarise_result(server.serve(closed, seed).result)["makespan_s"]
    steps: list[StreamStep] = []
    dropped = 0
    for load in STREAM_LOADS:
        for _ in range(STREAM_REPEATS):
            reqs = requests(load * throughput)
            run = server.serve(reqs, seed, members=True)
            got, lost = stream_steps(run, {r.id: r.prompt_tokens for r in reqs})
            steps += got
            dropped += lost
    info = {"trace": STREAM_TRACE, "scale": STREAM_SCALE, "requests": STREAM_REQUESTS,
            "closed_batch_rps": throughput, "qps": [x * throughput for x in STREAM_LOADS],
            "repeats": STREAM_REPEATS, "steps": len(steps), "steps_not_counted": dropped}
    return steps, info


@dataclass(frozen=True, slots=True)
class StreamFit:
    """The regression of the stream's excess (seconds) on a step's counts."""

    per_step_s: float
    per_row_s: float
    per_prefill_token_s: float
    per_new_s: float
    per_arrival_s: float
    steps: int
    excess_median_s: float  # median of period - price over the steps, before the fit
    residual_median_s: float  # after it (all four terms)

    @property
    def new_request_s(self) -> float:
        """What the twin charges a request in the step that first schedules it (beside its prompt tokens)."""
        return max(0.0, self.per_new_s + self.per_arrival_s)

    @property
    def new_request_token_s(self) -> float:
        """What the twin charges per prompt token of a request in the step that first schedules it."""
        return max(0.0, self.per_prefill_token_s)


def robust_lstsq(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Coefficients c of x @ c ~ y (seconds) by robust least squares: soft L1 at 0.5 ms, from the ordinary
    solution (a served step's period has a long slow tail that plain least squares follows)."""
    from scipy.optimize import least_squares

    start = np.linalg.lstsq(x, y, rcond=None)[0]
    return least_squares(lambda c: x @ c - y, start, loss="soft_l1", f_scale=5e-4).x


def fit_stream(cost: CostModel, steps: list[StreamStep]) -> StreamFit:
    """Robust least squares (`robust_lstsq`) of each step's period minus `cost`'s price on a per-step and a
    per-row term (controls: what the step's price may have wrong), a per-prompt-token, a per-new-request and a
    per-arrival term."""
    if len(steps) < 20:
        raise InputError(f"served_stream: {len(steps)} steps, too few to fit a request's cost (20 at least)")
    excess = np.array([s.period_s - cost.iteration_time(s.plan()) for s in steps])
    x = np.array([[1.0, len(s.decode_contexts) + s.new, sum(s.prefills), s.new, s.arrivals] for s in steps])
    c = robust_lstsq(x, excess)
    return StreamFit(*(float(v) for v in c), len(steps), float(np.median(excess)),
                     float(np.median(excess - x @ c)))
