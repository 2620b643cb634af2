"""The workload a run serves, declared once: which requests (a length profile or a trace file, how many, the
seed, their length scale) and how they arrive (rate, process, burstiness). The simulator's `RunConfig` and the
real engine's `RealConfig` embed it, and its fields are the command line's workload options
(`simctl.config_options`), so a new workload field is one field here: its option, its check (`validate`), the
requests it builds (`requests`) and its summary field (`recorded`) follow.

Light to import: the command line builds its default sections while parsing options, before any numerical
library is loaded (tests/test_startup_imports.py); the methods import the trace builder when they run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from simctl.common.checks import is_int, is_number
from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.traces.session_defaults import DEFAULT_THINK_S, SESSION_TRACE

if TYPE_CHECKING:
    from simctl.traces.request import Request

# Upper bounds that keep a run from exhausting memory or the float clock's resolution: at 1e9 s
# (~32 years) a float64 time still resolves 0.2 us, far below any iteration's duration.
MAX_REQUESTS = 10_000_000
MAX_CLOCK_S = 1e9

TRACE_HELP = ("Length profile (sharegpt, arxiv), sessions (multi-turn chats, --qps sessions per second), or "
              "a trace file: CSV with num_prefill_tokens, num_decode_tokens[, arrived_at] (sessions: "
              "session_id, num_new_tokens, num_decode_tokens[, think_s, arrived_at]), JSONL, or a "
              "`vllm bench serve --save-detailed` result (.json: its requests, sent when it sent them).")
SEED_HELP = "Seed for lengths and arrivals: same seed, same results."
MAX_SYSTEM_PROMPT_TOKENS = 2**31 - 1


@dataclass(frozen=True)
class Workload:
    """The requests: their lengths, how many, how they arrive, and the seed that draws both. Each command
    declares its own defaults as an instance (`qps`, `num_requests` None: the command's default, see
    `resolved`)."""

    trace: str = option_field("arxiv", TRACE_HELP)
    # None: a trace file's own arrival times (with a rate, they are time-scaled to it)
    qps: float | None = option_field(0.5, (
        "Mean arrival rate, requests per second [default: 0.5 for `run`, 1 for `real`; a trace file's own "
        "arrival times are replayed, or time-scaled to the rate given]."))
    num_requests: int | None = option_field(1000, (
        "Requests to serve [default: 1000 for `run` and per `capacity` or `plan` probe (per replica in a "
        "`plan` check), 100 for `real`, 300 per `validate` run (150 with --engine vllm); every row of a "
        "trace file (`capacity`: at most 1000)]."))
    seed: int = option_field(0, SEED_HELP)
    arrival: str = option_field("poisson", "Arrival process: poisson, or gamma (bursty, see --cv).")
    cv: float = option_field(1.0, "Coefficient of variation of gamma inter-arrivals.")
    scale: float = option_field(1.0, "Multiply prompt and output lengths (e.g. 0.05 makes sharegpt "
                                "CPU-sized); recorded in the summary.")
    # Closed-loop clients (vLLM bench's --max-concurrency): None, open loop
    concurrency: int | None = option_field(None, (
        "Closed loop: at most N requests in flight, each client sending its next request when its previous "
        "one completed (plus --think-time). Without --qps every request is ready at once (`vllm bench serve "
        "--max-concurrency N`; a trace file's own arrival times: when each is ready); with --qps they arrive "
        "at that rate and wait for a free client. A request is timed from its send. [default: a vLLM bench "
        "result's own --max-concurrency]"))
    think_time: float = option_field(0.0, "Seconds a closed-loop client waits after a response before "
                                     "sending its next request (needs --concurrency).")
    # Generated sessions (--trace sessions): shared system prompts, and the think time before a later turn
    system_prompt_tokens: int = option_field(0, (
        "--trace sessions: tokens of the system prompt every session starts with (0: none), shared by the "
        "sessions that pick the same one (--system-prompts); scaled by --scale."))
    system_prompts: int = option_field(1, "--trace sessions: distinct system prompts; each session picks one "
                                       "at random.")
    session_think_time: float = option_field(DEFAULT_THINK_S, (
        "--trace sessions: mean seconds (exponential) from a turn's answer to the session's next turn; an "
        "assumption, no published statistic (0: at once, as an agent)."))
    hash_block_size: int = option_field(512, (
        "Tokens per block id (hash_ids) of a Mooncake trace file (512 in Mooncake's; vLLM's timed_trace "
        "default is 16); with --scale, the block scales with the lengths."))

    def at(self, qps: float) -> Workload:
        """The same requests arriving at `qps` (a validation's loads, a capacity probe's rate)."""
        return replace(self, qps=qps)

    def at_concurrency(self, clients: int) -> Workload:
        """The same requests sent by `clients` closed-loop clients (a closed-loop validation's loads)."""
        return replace(self, concurrency=clients)

    def in_working_folder(self) -> Workload:
        """This workload with a trace file's path made absolute in the user's working folder, before a child
        process (a capacity worker, a Ray task, the real engine's server) reads it."""
        from simctl.traces.build import trace_in_working_folder

        trace = trace_in_working_folder(self.trace)
        return self if trace == self.trace else replace(self, trace=trace)

    def resolved(self, qps: float, num_requests: int) -> Workload:
        """A command's defaults where its options were not given: `qps` unless a trace file gives its own
        arrival times or the clients are a closed loop, `num_requests` for a length profile and a trace
        file's every row, and the client bound a `vllm bench serve` result was measured with."""
        from simctl.traces.build import has_arrival_times, is_profile, trace_rows
        from simctl.traces.vllm_bench import measured_concurrency

        given, w = str(self.trace).strip(), self
        if w.concurrency is None and given and not is_profile(w.trace):
            w = replace(w, concurrency=measured_concurrency(w.trace))
        if w.qps is None and w.concurrency is None and (not given or not has_arrival_times(w.trace)):
            w = replace(w, qps=qps)
        if w.num_requests is None:
            rows = trace_rows(w.trace) if given and not is_profile(w.trace) else None
            w = replace(w, num_requests=num_requests if rows is None else rows)
        return w

    def validate(self) -> None:
        """Check every field without reading a trace file; InputError naming the bad value and what is
        allowed, as the command line spells the option."""
        from simctl.traces.build import ARRIVAL_PROCESSES, check_scale, is_profile
        from simctl.traces.lengths import PROFILES

        if not str(self.trace).strip():
            raise InputError(f"--trace is empty; give a length profile ({', '.join(PROFILES)}) "
                             "or a .csv / .jsonl trace file")
        if self.qps is None and is_profile(self.trace) and self.concurrency is None:
            raise InputError(f"--qps is needed: generated trace {self.trace!r} gives no arrival times")
        if self.qps is not None and (not is_number(self.qps)
                                     or not (self.qps > 0 and math.isfinite(self.qps))):
            raise InputError(f"--qps must be a finite number > 0 (requests per second), got {self.qps!r}")
        if not is_int(self.num_requests) or not 1 <= self.num_requests <= MAX_REQUESTS:
            raise InputError(f"--num-requests must be an integer from 1 to {MAX_REQUESTS}, "
                             f"got {self.num_requests!r}")
        if self.qps is not None and self.num_requests / self.qps > MAX_CLOCK_S:
            raise InputError(f"--qps {self.qps!r} is too low: {self.num_requests} requests would take about "
                             f"{self.num_requests / self.qps:.3g} s to arrive, beyond the simulated clock's "
                             f"{MAX_CLOCK_S:.0e} s; raise --qps")
        if not is_int(self.seed) or self.seed < 0:
            raise InputError(f"--seed must be an integer >= 0, got {self.seed!r}")
        check_scale(self.scale)
        if self.arrival not in ARRIVAL_PROCESSES:
            raise InputError(f"unknown --arrival {self.arrival!r}; known: {', '.join(ARRIVAL_PROCESSES)}")
        if not is_number(self.cv) or not (self.cv > 0 and math.isfinite(self.cv)):
            raise InputError(f"--cv must be a finite number > 0, got {self.cv!r}")
        if self.arrival == "poisson" and self.cv != 1.0:
            raise InputError(f"--cv {self.cv!r} needs --arrival gamma (Poisson arrivals always have cv 1)")
        if self.concurrency is not None and (not is_int(self.concurrency) or self.concurrency < 1):
            raise InputError(f"--concurrency must be an integer >= 1 (requests in flight), got "
                             f"{self.concurrency!r}")
        if not is_number(self.think_time) or not (0 <= self.think_time < MAX_CLOCK_S):
            raise InputError(f"--think-time must be a number of seconds >= 0, got {self.think_time!r}")
        if not is_int(self.hash_block_size) or not 1 <= self.hash_block_size <= MAX_REQUESTS:
            raise InputError(f"--hash-block-size must be an integer from 1 to {MAX_REQUESTS} (tokens per "
                             f"block id), got {self.hash_block_size!r}")
        if self.think_time and self.concurrency is None:
            raise InputError("--think-time is a closed-loop client's pause: give --concurrency too")
        self._validate_sessions()

    def _validate_sessions(self) -> None:
        tokens = self.system_prompt_tokens
        if not is_int(tokens) or not 0 <= tokens <= MAX_SYSTEM_PROMPT_TOKENS:
            raise InputError(f"--system-prompt-tokens must be an integer >= 0, got {tokens!r}")
        if not is_int(self.system_prompts) or self.system_prompts < 1:
            raise InputError(f"--system-prompts must be an integer >= 1, got {self.system_prompts!r}")
        if not is_number(self.session_think_time) or not 0 <= self.session_think_time < MAX_CLOCK_S:
            raise InputError("--session-think-time must be a number of seconds >= 0, "
                             f"got {self.session_think_time!r}")
        given = [option for option, value, default in (
            ("--system-prompt-tokens", tokens, 0), ("--system-prompts", self.system_prompts, 1),
            ("--session-think-time", self.session_think_time, DEFAULT_THINK_S)) if value != default]
        if given and str(self.trace).strip() != SESSION_TRACE:
            raise InputError(f"{', '.join(given)} describe(s) generated sessions: give --trace "
                             f"{SESSION_TRACE} (a session trace file gives each turn's think_s itself)")
        if str(self.trace).strip() == SESSION_TRACE and self.qps is None:
            raise InputError(f"--qps is needed: the rate at which --trace {SESSION_TRACE} starts sessions")
        if self.system_prompts > 1 and not self.system_prompt_tokens:
            raise InputError(f"--system-prompts {self.system_prompts} needs --system-prompt-tokens "
                             "(their length)")

    def requests(self) -> list[Request]:
        """The requests, ids 0..n-1 in arrival order (`simctl.traces.build`); the caller passes them on
        rather than building them again."""
        from simctl.traces.build import build_trace, has_arrival_times

        qps = self.qps
        if qps is None and self.concurrency is not None and not has_arrival_times(self.trace):
            qps = math.inf  # closed loop without a rate: all ready at t=0 (vLLM bench's --request-rate inf)
        return build_trace(self.trace, self.num_requests, qps, self.seed, arrival=self.arrival, cv=self.cv,
                           scale=self.scale, system_prompt_tokens=self.system_prompt_tokens,
                           system_prompts=self.system_prompts, session_think_s=self.session_think_time,
                           hash_block=self.hash_block_size)

    def recorded(self) -> dict[str, Any]:
        """The summary's workload fields, in declaration order."""
        return asdict(self)

    @classmethod
    def of_record(cls, record: dict[str, Any]) -> Workload:
        """The workload a summary (or a validation's config) recorded; a field it predates keeps its
        default."""
        return cls(**{f.name: record[f.name] for f in fields(cls) if f.name in record})
