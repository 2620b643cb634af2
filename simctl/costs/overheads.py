"""What a serving engine's host costs per step, on top of the GPU's kernels: the step overheads every cost
model adds to an iteration.

    t = max(gpu_time, launch_floor_s) + iteration_s + request_s x scheduled requests + sampled_token_s x r
        + sum over newly scheduled requests of (new_request_s + new_request_token_s x its prompt tokens)

- `iteration_s`: per step (scheduling, input preparation, the step's Python), paid whatever the batch.
- `request_s`: per scheduled request (its block table, positions, output processing).
- `sampled_token_s`: per sampled token (sampling and detokenising on the host).
- `new_request_s`, `new_request_token_s`: per request scheduled for the first time (`Seq.first_scheduled_s`
  unset when the step is priced), and per prompt token of it: what a request costs the host once (its intake,
  its prompt carried to the engine and the model runner, its first scheduling), paid by the step that first
  schedules it. Fitted from a served request stream (`profiler/vllm_stream.py`).
- `admission_s`: not a step's cost but the front end's latency, from a request's arrival to the scheduler
  that can first schedule it (the server's request intake and its hand-over to the engine core): the
  simulator makes a request schedulable that long after it arrives (`serving.inbox.Inbox`); its TTFT still
  counts from the arrival. Measured on a served engine left idle between requests
  (`profiler/vllm_served.py`); 0 elsewhere.
- `launch_floor_s`: in eager mode every kernel is launched from Python, and the GPU cannot finish a step
  before the host has launched it; the launches overlap the kernels they feed, so a step costs at least the
  launch time (a floor), not the launch time plus the kernels. CUDA graphs replay a step's launches at once
  (floor 0).

Execution modes (`EXECUTION_MODES`) give the roofline's defaults:
- `cuda-graph` (the default): 18.1 us per layer per step and 0.118 ms per scheduled request on the host
  (0.58 ms a step for 32 layers, 1.45 ms for 80), 0 per sampled token: fitted with the H100's mbu (0.856,
  catalogue/gpus.py) to vLLM served on H100s (the P50 TPOT of four synchronous phases, Llama-2-7B and
  CodeLlama-34B, batch 1) and vLLM's CI latency case Llama-3.1-8B on an H100 (batch 8: it separates the
  per-request term from the per-step one), research/results/gpu_step_forms.md (split A, `layer+request`).
  Held out there: 25 other unsaturated phases (TPOT 1.4%, E2E 1.6% MAPE), 5 saturated ones (4.9%, 5.2%),
  and the CI's A100 8B, Mixtral TP2 and Llama-3-70B TP4 cases (5.3% with vLLM's all-reduce, worst -7.5%).
  Per layer, not per step: CUDA-graph replay's per-kernel gaps grow with the layers, and a constant fitted
  on 7B-34B leaves the 80-layer model 9-12% fast. Host terms are the engine's, so every GPU takes them.
- `eager`: a launch floor of 22 ms per iteration measured by this project for a 7B model (32 layers) on an
  H100 in eager mode (simctl issue 22), taken per layer (0.6875 ms: launches grow with the kernels, i.e. the
  layers), plus the same host terms: scheduling, input preparation and output processing are the engine's
  Python whatever launches the kernels, while the launches overlap the kernels (the floor).
A fitted model fits what its profile measures (a simctl profile times whole steps: its `overhead_s`); an
operator profile times kernels only, so its fit takes the execution mode's defaults (its summary says so).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from simctl.common.checks import is_number
from simctl.common.errors import InputError
from simctl.policies.plan import BatchPlan

EAGER_LAUNCH_S_PER_LAYER = 22e-3 / 32  # this project's H100 measurement: ~22 ms floor, 7B model, 32 layers
# fitted (the module docstring): the host's time per layer of a step, and per scheduled request
HOST_S_PER_LAYER = 18.1e-6
HOST_S_PER_REQUEST = 0.118e-3
EXECUTION_MODES = ("cuda-graph", "eager")


def _check_execution(execution: str) -> None:
    if execution not in EXECUTION_MODES:
        raise InputError(f"execution must be one of {', '.join(EXECUTION_MODES)}, got {execution!r}")


@dataclass(frozen=True, slots=True)
class StepOverheads:
    """A cost model's host terms per step (seconds); see the module docstring."""

    execution: str = "cuda-graph"
    iteration_s: float = 0.0
    request_s: float = 0.0
    sampled_token_s: float = 0.0
    launch_floor_s: float = 0.0
    source: str = "roofline defaults"
    new_request_s: float = 0.0
    new_request_token_s: float = 0.0
    admission_s: float = 0.0

    def __post_init__(self) -> None:
        _check_execution(self.execution)
        for name in ("iteration_s", "request_s", "sampled_token_s", "launch_floor_s", "new_request_s",
                     "new_request_token_s", "admission_s"):
            v = getattr(self, name)
            if not (is_number(v) and 0 <= v < float("inf")):
                raise InputError(f"step overhead {name} must be a finite number >= 0, got {v!r}")

    @classmethod
    def defaults(cls, execution: str, num_layers: int) -> StepOverheads:
        """The roofline's defaults for an execution mode and a model of `num_layers` layers."""
        _check_execution(execution)
        floor = EAGER_LAUNCH_S_PER_LAYER * num_layers if execution == "eager" else 0.0
        return cls(execution, HOST_S_PER_LAYER * num_layers, HOST_S_PER_REQUEST, 0.0, floor,
                   f"{execution} defaults")

    @property
    def per_request_only(self) -> tuple[float, float] | None:
        """(per step, per scheduled request) when no other term is set (per sampled token, per new request),
        else None: the hot paths then add `step + request x len(plan.seqs)` instead of calling `of`."""
        other = self.sampled_token_s or self.new_request_s or self.new_request_token_s
        return None if other else (self.iteration_s, self.request_s)

    def host(self, requests: int, sampled: int) -> float:
        """The additive per-step host terms of a step of `requests` scheduled requests sampling `sampled`
        tokens (every cost model's; a term that is 0 is skipped: the hot path pays nothing for it); `of` adds
        a plan's new requests."""
        t = self.iteration_s
        if self.request_s:
            t += self.request_s * requests
        if self.sampled_token_s:
            t += self.sampled_token_s * sampled
        return t

    def of(self, plan: BatchPlan, repeat: int = 0) -> float:
        """`host` of a plan, priced before it runs (its new requests are those never scheduled yet); a
        stretch's repeat j > 0 of it schedules none for the first time."""
        return self.host(len(plan.seqs), plan.sampled_tokens) + (0.0 if repeat else self.first_time(plan))

    def first_time(self, plan: BatchPlan) -> float:
        """The `new_request_s` terms of a plan about to run (0 without that term)."""
        if not (self.new_request_s or self.new_request_token_s):
            return 0.0
        new = [s.prompt_tokens for s in plan.seqs if s.first_scheduled_s < 0]
        return self.new_request_s * len(new) + self.new_request_token_s * sum(new)

    def to_json(self) -> dict[str, Any]:
        """Its fields; a per-new-request term or an admission latency that is 0 is left out (older files
        read the same)."""
        return {k: v for k, v in asdict(self).items()
                if not (k in ("new_request_s", "new_request_token_s", "admission_s") and v == 0)}

    @classmethod
    def from_json(cls, data: Any) -> StepOverheads:
        if not isinstance(data, dict):
            raise InputError("step_overheads must be an object")
        unknown = set(data) - set(cls.__dataclass_fields__)
        if unknown:
            raise InputError(f"step_overheads: unknown key(s) {', '.join(sorted(unknown))}")
        return cls(**data)

    def describe(self) -> str:
        """One line for `simctl list` and reports."""
        floor = f", launch floor {self.launch_floor_s * 1e3:.3g} ms" if self.launch_floor_s else ""
        new = (f" + {self.new_request_s * 1e6:.3g} us/new request + {self.new_request_token_s * 1e6:.3g} "
               "us/its prompt token" if self.new_request_s or self.new_request_token_s else "")
        admission = f", admission {self.admission_s * 1e3:.3g} ms" if self.admission_s else ""
        return (f"{self.execution}: {self.iteration_s * 1e3:.3g} ms/step + {self.request_s * 1e6:.3g} "
                f"us/request + {self.sampled_token_s * 1e6:.3g} us/sampled token{new}{floor}{admission} "
                f"({self.source})")
