"""Request traces: seeded arrival processes, length profiles fitted to published data, and file loaders."""

from traces.arrivals import gamma_arrivals, poisson_arrivals
from traces.build import (
    ARRIVAL_PROCESSES,
    build_trace,
    has_arrival_times,
    is_profile,
    trace_max_total_tokens,
    trace_rows,
)
from traces.lengths import PROFILES, LengthProfile, get_profile, sample_lengths
from traces.loaders import LoadedTrace, load_trace_file
from traces.request import Request

__all__ = [
    "ARRIVAL_PROCESSES",
    "PROFILES",
    "LengthProfile",
    "LoadedTrace",
    "Request",
    "build_trace",
    "gamma_arrivals",
    "get_profile",
    "has_arrival_times",
    "is_profile",
    "load_trace_file",
    "poisson_arrivals",
    "sample_lengths",
    "trace_max_total_tokens",
    "trace_rows",
]
