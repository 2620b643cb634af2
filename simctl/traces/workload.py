"""The workload a run serves, declared once: which requests (a length profile or a trace file, how many, the
seed, their length scale) and how they arrive (rate, process, burstiness). The simulator's `RunConfig` and the
real engine's `RealConfig` embed it, and its fields are the command line's workload options
(`simctl.config_options`), so a new workload field is one field here: its option, its check (`validate`), the
requests it builds (`requests`) and its summary field (`recorded`) follow.

Light to import: the command line builds its default sections while parsing options, before any numerical
library is loaded (tests/test_startup_imports.py); the methods import the trace builder when they run."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

from simctl.common.checks import is_int, is_number
from simctl.common.errors import InputError
from simctl.common.option_fields import option_field

if TYPE_CHECKING:
    from simctl.traces.request import Request

# Upper bounds that keep a run from exhausting memory or the float clock's resolution: at 1e9 s
# (~32 years) a float64 time still resolves 0.2 us, far below any iteration's duration.
MAX_REQUESTS = 10_000_000
MAX_CLOCK_S = 1e9

TRACE_HELP = ("Length profile (sharegpt, arxiv) or a trace file: CSV with num_prefill_tokens, "
              "num_decode_tokens[, arrived_at], JSONL, or a `vllm bench serve --save-detailed` result "
              "(.json: its requests, sent when it sent them).")
SEED_HELP = "Seed for lengths and arrivals: same seed, same results."


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
        "`plan` check), 100 for `real`; every row of a trace file (`capacity`: at most 1000)]."))
    seed: int = option_field(0, SEED_HELP)
    arrival: str = option_field("poisson", "Arrival process: poisson, or gamma (bursty, see --cv).")
    cv: float = option_field(1.0, "Coefficient of variation of gamma inter-arrivals.")
    scale: float = option_field(1.0, "Multiply prompt and output lengths (e.g. 0.05 makes sharegpt "
                                "CPU-sized); recorded in the summary.")
    # Closed-loop clients (vLLM bench's --max-concurrency): None, open loop
    concurrency: int | None = option_field(None, (
        "Closed loop: at most N requests in flight, each client sending its next request when its previous "
        "one completed (plus --think-time). Without --qps every request is ready at once (`vllm bench serve "
        "--max-concurrency N`); with --qps they arrive at that rate and wait for a free client."))
    think_time: float = option_field(0.0, "Seconds a closed-loop client waits after a response before "
                                     "sending its next request (needs --concurrency).")
    hash_block_size: int = option_field(512, (
        "Tokens per block id (hash_ids) of a Mooncake trace file (512 in Mooncake's; vLLM's timed_trace "
        "default is 16); with --scale, the block scales with the lengths."))

    def in_working_folder(self) -> Workload:
        """This workload with a trace file's path made absolute in the user's working folder, before a child
        process (a capacity worker, a Ray task, the real engine's server) reads it."""
        from simctl.traces.build import trace_in_working_folder

        trace = trace_in_working_folder(self.trace)
        return self if trace == self.trace else replace(self, trace=trace)

    def resolved(self, qps: float, num_requests: int) -> Workload:
        """A command's defaults where its options were not given: `qps` unless a trace file gives its own
        arrival times, `num_requests` for a length profile and a trace file's every row."""
        from simctl.traces.build import has_arrival_times, is_profile, trace_rows

        given, w = str(self.trace).strip(), self
        if w.qps is None and (not given or not has_arrival_times(w.trace)):
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
            raise InputError(f"--qps is needed: length profile {self.trace!r} gives no arrival times")
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
            raise InputError(f"--concurrency must be an integer >= 1 (requests in flight), got {self.concurrency!r}")
        if not is_number(self.think_time) or not (0 <= self.think_time < MAX_CLOCK_S):
            raise InputError(f"--think-time must be a number of seconds >= 0, got {self.think_time!r}")
        if not is_int(self.hash_block_size) or not 1 <= self.hash_block_size <= MAX_REQUESTS:
            raise InputError(f"--hash-block-size must be an integer from 1 to {MAX_REQUESTS} (tokens per "
                             f"block id), got {self.hash_block_size!r}")
        if self.think_time and self.concurrency is None:
            raise InputError("--think-time is a closed-loop client's pause: give --concurrency too")

    def requests(self) -> list[Request]:
        """The requests, ids 0..n-1 in arrival order (`simctl.traces.build`); the caller passes them on
        rather than building them again."""
        from simctl.traces.build import build_trace

        return build_trace(self.trace, self.num_requests, self.qps, self.seed, arrival=self.arrival,
                           cv=self.cv, scale=self.scale, hash_block=self.hash_block_size)

    def recorded(self) -> dict[str, Any]:
        """The summary's workload fields, in declaration order."""
        return asdict(self)
