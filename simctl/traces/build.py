"""Turn a trace spec (a length-profile name or a trace file path) into a list of ``Request``s.

- Profile (``sharegpt``, ``arxiv``): lengths from the profile, then arrivals from the chosen generator, both
  from ONE ``np.random.default_rng(seed)`` in that order, so a (spec, n, qps, seed, arrival, cv) tuple
  always yields the same trace.
- File WITH arrival times: the first ``num_requests`` rows are replayed as given (lengths and arrivals), or,
  with a ``qps``, with every arrival time multiplied by one factor that makes their mean rate ``qps`` (the
  pattern of the trace kept: what a capacity search over a real trace needs). ``arrival`` and ``cv`` describe
  generated arrivals: another value than the default is refused rather than ignored.
- File WITHOUT arrival times: the first ``num_requests`` rows' lengths, in file order, with arrivals
  generated as for a profile.
- For a file, ``num_requests=None`` means every row; asking for more rows than the file has is an error
  (we neither cycle through the file nor silently return fewer requests than asked for).
- ``sessions`` (``simctl.traces.sessions``) and a session file: ``num_requests`` counts turns, each session's
  turns together and sessions by start, so only the last session may be cut; a rate is sessions per second
  (a file's session starts time-scaled to it); ``scale`` multiplies the turns' new and output tokens (and the
  system prompt) before each prompt is chained from them.
- ``scale`` multiplies every prompt and output length (rounded, at least 1) after all of the above, arrivals
  unchanged: ``sharegpt`` x 0.05 is a CPU-sized trace with the same shape. A profile's max sequence length
  scales with it (``trace_max_total_tokens``).
- A Mooncake file's prompts have ceil(prompt / ``hash_block``) block ids each (checked). Scaled, the hash
  block becomes round(``hash_block`` x scale) tokens and each scaled prompt is moved into the range its id
  count covers at that block (k ids: (k - 1) x block + 1 to k x block tokens), so that it keeps its k ids and
  two prompts sharing k ids still share k blocks' tokens.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np

from simctl.common.errors import InputError
from simctl.common.files import in_working_folder
from simctl.traces.arrivals import arrival_times
from simctl.traces.lengths import PROFILES, get_profile, sample_lengths, scale_lengths
from simctl.traces.loaders import SUPPORTED_EXTENSIONS, LoadedTrace, load_trace_file
from simctl.traces.mooncake import check_hash_counts, keep_id_counts, scaled_block
from simctl.traces.request import Request
from simctl.traces.session_defaults import DEFAULT_THINK_S, SESSION_TRACE
from simctl.traces.sessions import (
    chained_prompts,
    generate_sessions,
    previous_turns,
    session_requests,
)

ARRIVAL_PROCESSES = ("poisson", "gamma")
# File traces report their max sequence length rounded up to this, a KV block / tile friendly multiple.
SEQ_LEN_ALIGN = 16


def check_scale(scale: object) -> float:
    """`scale` if it is a finite number > 0 (and at most 1e6), else InputError."""
    if isinstance(scale, bool) or not isinstance(scale, (int, float)) or not (0 < scale <= 1e6):
        raise InputError(f"--scale must be a number > 0 (lengths are multiplied by it), got {scale!r}")
    return float(scale)


def is_profile(trace: str | os.PathLike[str]) -> bool:
    """Whether `trace` names a generated trace: a length profile, or sessions."""
    return isinstance(trace, str) and (trace in PROFILES or trace == SESSION_TRACE)


def _looks_like_path(trace: str | os.PathLike[str]) -> bool:
    text = os.fspath(trace)
    return (
        not isinstance(trace, str)
        or os.sep in text
        or "/" in text
        or Path(text).suffix.lower() in SUPPORTED_EXTENSIONS
        or Path(text).exists()
    )


def trace_in_working_folder(trace: str) -> str:
    """A trace file's path made absolute in the user's working folder; a length profile's name as it is."""
    if isinstance(trace, str | os.PathLike) and str(trace).strip() and not is_profile(trace) \
            and _looks_like_path(trace):
        return in_working_folder(trace)
    return trace


def _resolve(trace: str | os.PathLike[str]) -> str | LoadedTrace:
    """The profile name, or the loaded file; an InputError for anything else."""
    if is_profile(trace):
        return str(trace)
    if _looks_like_path(trace):
        return load_trace_file(trace)
    raise InputError(
        f"unknown trace {str(trace)!r}: not a length profile (known: {', '.join(sorted(PROFILES))}), "
        f"{SESSION_TRACE!r} nor a {' / '.join(SUPPORTED_EXTENSIONS)} file"
    )


def _check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise InputError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def trace_rows(trace: str | os.PathLike[str]) -> int | None:
    """How many requests a trace file holds (None for a length profile, which draws any number)."""
    source = _resolve(trace)
    return None if isinstance(source, str) else len(source)


def has_arrival_times(trace: str | os.PathLike[str]) -> bool:
    """Whether `trace` is a file that gives its own arrival times."""
    source = _resolve(trace)
    return not isinstance(source, str) and source.has_arrivals


def _time_scaled(source: LoadedTrace, arrivals: np.ndarray, qps: float) -> np.ndarray:
    """`arrivals` stretched or squeezed by one factor so that their mean rate is `qps`."""
    span = float(arrivals[-1] - arrivals[0])
    if len(arrivals) < 2 or span <= 0:
        raise InputError(f"trace file {source.path}: its {len(arrivals)} arrival time(s) span no time, so "
                         "they cannot be scaled to a rate (--qps); leave --qps out to replay them")
    return arrivals * ((len(arrivals) - 1) / span / qps)


def build_trace(
    trace: str | os.PathLike[str],
    num_requests: int | None,
    qps: float | None,
    seed: int,
    arrival: str = "poisson",
    cv: float = 1.0,
    scale: float = 1.0,
    *,
    system_prompt_tokens: int = 0,
    system_prompts: int = 1,
    session_think_s: float = DEFAULT_THINK_S,
    hash_block: int = 512,
) -> list[Request]:
    """Requests with ids 0..n-1 in arrival order (see the module docstring for the rules); the keywords are
    the sessions generator's (`simctl.traces.sessions`) and, `hash_block`, the tokens per block id of a
    Mooncake file."""
    scale, seed, num_requests = _checked(scale, arrival, cv, seed, num_requests)
    source = _resolve(trace)
    rng = np.random.default_rng(seed)
    if isinstance(source, str) and num_requests is None:
        raise InputError(f"the number of requests is required for generated trace {source!r}")
    if source == SESSION_TRACE:
        return generate_sessions(num_requests, qps, rng, arrival=arrival, cv=cv,
                                 scale=scale, system_prompt_tokens=system_prompt_tokens,
                                 system_prompts=system_prompts, think_s=session_think_s)
    if isinstance(source, LoadedTrace) and source.session is not None:
        return _with_priority(_session_file(source, num_requests, qps, arrival, cv, scale, rng), source,
                              num_requests)

    prefixes: list[tuple[int, int]] = []
    if isinstance(source, str):
        prompts, outputs = sample_lengths(source, num_requests, rng)
        arrivals = arrival_times(num_requests, qps, arrival, cv, rng)
    else:
        prompts, outputs, arrivals, prefixes = _from_file(source, num_requests, qps, arrival, cv, rng)

    prompts, outputs = np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
    hashes = () if isinstance(source, str) or source.hash_ids is None else source.hash_ids[:len(prompts)]
    if hashes:
        check_hash_counts(source.path, prompts, hashes, hash_block)
    if scale != 1.0:
        prompts, outputs = scale_lengths(prompts, scale), scale_lengths(outputs, scale)
        if hashes:
            hash_block = scaled_block(hash_block, scale)
            prompts = keep_id_counts(prompts, hashes, hash_block)
        prefixes = _scaled_prefixes(prefixes, prompts, scale)
    arrivals = np.asarray(arrivals, dtype=np.float64)
    requests = [  # plain Python numbers (tolist), so that a Request holds no numpy scalar
        Request(i, a, p, o)
        for i, (a, p, o) in enumerate(zip(arrivals.tolist(), prompts.tolist(), outputs.tolist(), strict=True))
    ]
    if prefixes:
        requests = [replace(r, prefix_group=g, prefix_tokens=t)
                    for r, (g, t) in zip(requests, prefixes, strict=True)]
    if hashes:
        requests = [replace(r, hash_ids=h, hash_block=hash_block)
                    for r, h in zip(requests, hashes, strict=True)]
    return requests if isinstance(source, str) else _with_priority(requests, source, num_requests)


def _checked(scale: float, arrival: str, cv: float, seed: int, num_requests: int | None
             ) -> tuple[float, int, int | None]:
    """`build_trace`'s numbers checked (InputError naming the bad one): scale, seed, number of requests."""
    if arrival not in ARRIVAL_PROCESSES:
        raise InputError(f"unknown arrival process {arrival!r} (known: {', '.join(ARRIVAL_PROCESSES)})")
    if arrival == "poisson" and cv != 1.0:
        raise InputError(f"cv={cv!r} given with poisson arrivals (Poisson has cv 1); use arrival='gamma'")
    count = None if num_requests is None else _check_int("num_requests", num_requests, 1)
    return check_scale(scale), _check_int("seed", seed, 0), count


def _scaled_prefixes(prefixes: list[tuple[int, int]], prompts: np.ndarray,
                     scale: float) -> list[tuple[int, int]]:
    """A shared prefix scaled with its prompt, staying within it (0 stays 0)."""
    return [(g, min(int(t * scale + 0.5), p)) for (g, t), p in zip(prefixes, prompts.tolist())]


def _with_priority(requests: list[Request], source: LoadedTrace, num_requests: int | None) -> list[Request]:
    if source.priority is None:
        return requests
    priority = source.priority[:len(requests)].tolist()
    return [replace(r, priority=k) for r, k in zip(requests, priority, strict=True)]


def _rows(source: LoadedTrace, num_requests: int | None) -> int:
    n = len(source) if num_requests is None else num_requests
    if n > len(source):
        raise InputError(f"trace file {source.path}: {n} requests asked for but it has only {len(source)}")
    return n


def _file_arrivals(source: LoadedTrace, given: np.ndarray | None, n: int, qps: float | None, arrival: str,
                   cv: float, rng: np.random.Generator) -> np.ndarray:
    """The file's arrival times `given` (time-scaled to `qps` if given), else `n` generated ones."""
    if given is None:
        return arrival_times(n, qps, arrival, cv, rng)
    if arrival != "poisson" or cv != 1.0:
        raise InputError(f"trace file {source.path} gives its own arrival times: --arrival and --cv "
                         "describe generated ones (drop them, or the file's arrival column)")
    return given if qps is None else _time_scaled(source, given, qps)


def _from_file(source: LoadedTrace, num_requests: int | None, qps: float | None, arrival: str, cv: float,
               rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray, list[tuple[int, int]]]:
    """A trace file's first `num_requests` (all: None) prompt and output lengths, arrival times (the file's,
    time-scaled to `qps` if given, else generated) and (prefix_group, prefix_tokens) where the file gives
    them (else empty)."""
    n = _rows(source, num_requests)
    prefixes = []
    if source.prefix_group is not None and source.prefix_tokens is not None:
        prefixes = list(zip(source.prefix_group[:n].tolist(), source.prefix_tokens[:n].tolist()))
    given = None if source.arrival_s is None else source.arrival_s[:n]
    arrivals = _file_arrivals(source, given, n, qps, arrival, cv, rng)
    return source.prompt_tokens[:n], source.output_tokens[:n], arrivals, prefixes


def _session_file(source: LoadedTrace, num_requests: int | None, qps: float | None, arrival: str, cv: float,
                  scale: float, rng: np.random.Generator) -> list[Request]:
    """A session file's first `num_requests` turns (each session's together, sessions by start: the last one
    may be cut), their prompts chained from the (scaled) new and output tokens, arrivals per session (the
    file's, time-scaled to `qps` if given, else generated at `qps` sessions per second)."""
    n = _rows(source, num_requests)
    assert source.session is not None and source.new_tokens is not None and source.think_s is not None
    session, new, outputs = source.session[:n], source.new_tokens[:n], source.output_tokens[:n]
    if scale != 1.0:
        new, outputs = scale_lengths(new, scale), scale_lengths(outputs, scale)
    prompts = chained_prompts(session, new, outputs, np.zeros_like(new))
    first = previous_turns(session) < 0
    given = None if source.arrival_s is None else source.arrival_s[:n][first]
    starts = _file_arrivals(source, given, int(first.sum()), qps, arrival, cv, rng)
    groups, tokens = np.full(n, -1, dtype=np.int64), np.zeros(n, dtype=np.int64)
    if source.prefix_group is not None and source.prefix_tokens is not None:
        prefixes = list(zip(source.prefix_group[:n].tolist(), source.prefix_tokens[:n].tolist()))
        if scale != 1.0:
            prefixes = _scaled_prefixes(prefixes, prompts, scale)
        groups, tokens = (np.asarray(v, dtype=np.int64) for v in zip(*prefixes))
    return session_requests(starts, session, prompts, outputs, source.think_s[:n], groups, tokens)


def aligned(tokens: float) -> int:
    """`tokens` rounded up to a multiple of ``SEQ_LEN_ALIGN``: how a max sequence length is sized."""
    return math.ceil(tokens / SEQ_LEN_ALIGN) * SEQ_LEN_ALIGN


def trace_max_total_tokens(trace: str | os.PathLike[str], requests: Sequence[Request],
                           scale: float = 1.0) -> int:
    """Max sequence length (prompt + output) a run of this trace needs.

    A profile's cap (every generated request fits, and it matches what the paper configured), times `scale`
    rounded up to a multiple of ``SEQ_LEN_ALIGN``; for a file, the longest request rounded up to a multiple of
    ``SEQ_LEN_ALIGN``.
    """
    if trace in PROFILES:
        cap = get_profile(str(trace)).max_total_tokens
        if scale == 1.0:
            return cap
        return max([aligned(cap * scale),
                    *(r.prompt_tokens + r.output_tokens for r in requests)])
    if not requests:
        raise InputError("cannot size the max sequence length of an empty trace")
    return aligned(max(r.prompt_tokens + r.output_tokens for r in requests))
