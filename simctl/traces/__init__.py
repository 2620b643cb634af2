"""Request traces: seeded arrival processes, length profiles fitted to published data, and file loaders.

The names below load on first use: `traces.request` is imported by the model catalogue and so by the command
line's option parsing, which must not pay for numpy, scipy and pandas through this package."""

from simctl.common.lazy_exports import lazy_exports

__getattr__ = lazy_exports(__name__, {
    "gamma_arrivals": "arrivals", "poisson_arrivals": "arrivals",
    "ARRIVAL_PROCESSES": "build", "build_trace": "build", "has_arrival_times": "build", "is_profile": "build",
    "trace_max_total_tokens": "build", "trace_rows": "build",
    "PROFILES": "lengths", "LengthProfile": "lengths", "get_profile": "lengths", "sample_lengths": "lengths",
    "LoadedTrace": "loaders", "load_trace_file": "loaders",
    "Request": "request",
})

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
