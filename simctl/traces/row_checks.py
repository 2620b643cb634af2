"""Checks of one trace file row's values, each failing with an `InputError` that names the file and the
1-based line (`simctl.traces.loaders`, `simctl.traces.sessions`)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from simctl.common.errors import InputError

PRIORITY = "priority"  # optional in both formats: an integer, higher runs first (default 0)
PREFIX_GROUP, PREFIX_TOKENS = "prefix_group", "prefix_tokens"  # optional in both formats (default -1, 0)
# Guards the int64 conversion; no real request is anywhere near 2^31 tokens.
MAX_TOKENS = 2**31 - 1


def fail(path: Path, line: int, msg: str) -> InputError:
    return InputError(f"trace file {path}, line {line}: {msg}")


def short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_length(path: Path, line: int, name: str, value: float) -> int:
    """Validate one already-numeric length; returns it as int."""
    if not math.isfinite(value):
        raise fail(path, line, f"{name} is {value}, expected an integer >= 1")
    if value != math.floor(value):
        raise fail(path, line, f"{name} is {value}, expected an integer number of tokens")
    if value < 1:
        raise fail(path, line, f"{name} is {int(value)}, expected >= 1")
    if value > MAX_TOKENS:
        raise fail(path, line, f"{name} is {value:.6g}, larger than {MAX_TOKENS}")
    return int(value)


def check_priority(path: Path, line: int, value: float) -> int:
    if not (math.isfinite(value) and value == math.floor(value) and abs(value) <= MAX_TOKENS):
        raise fail(path, line, f"{PRIORITY} is {value}, expected an integer")
    return int(value)


def check_prefix(path: Path, line: int, group: float, tokens: float, prompt: int) -> tuple[int, int]:
    """A row's prefix_group (an integer >= -1) and prefix_tokens (an integer from 0 to its prompt tokens)."""
    if not (math.isfinite(group) and group == math.floor(group) and -1 <= group <= MAX_TOKENS):
        raise fail(path, line,
                    f"{PREFIX_GROUP} is {group:g}, expected an integer >= -1 (-1: no shared prefix)")
    if not (math.isfinite(tokens) and tokens == math.floor(tokens) and 0 <= tokens <= prompt):
        raise fail(path, line, f"{PREFIX_TOKENS} is {tokens:g}, expected an integer from 0 to the prompt's "
                                f"{prompt} tokens")
    return int(group), int(tokens)


def check_arrivals(path: Path, lines: np.ndarray, name: str, arrivals: np.ndarray) -> None:
    bad = ~np.isfinite(arrivals) | (arrivals < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise fail(path, int(lines[i]), f"{name} is {arrivals[i]}, expected a finite time >= 0 (seconds)")
    back = np.diff(arrivals) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        raise fail(
            path,
            int(lines[i]),
            f"{name} {arrivals[i]} is earlier than {arrivals[i - 1]} on line {lines[i - 1]}; "
            "arrivals must be sorted (non-decreasing)",
        )
