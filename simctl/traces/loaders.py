"""Load request traces from files, validating every row.

Formats (chosen by extension, case-insensitive):

- ``.csv``: Vidur's column names. Required ``num_prefill_tokens`` (prompt length) and ``num_decode_tokens``
  (output length); optional ``arrived_at`` (seconds from the start of the trace). Other columns are
  ignored, so Vidur's and Splitwise's files load unchanged. Blank lines are skipped.
- ``.jsonl``: one JSON object per line, e.g.
  ``{"prompt_tokens": 812, "output_tokens": 93, "arrival_s": 0.25}``; ``arrival_s`` is optional but
  must then be on every line or on none. Other keys are ignored, a repeated key is refused; blank lines are
  skipped.
- ``.json``: a ``vllm bench serve --save-result --save-detailed`` result (``simctl.traces.vllm_bench``): its
  successful requests' lengths, arriving when the benchmark sent them.
- ``.jsonl`` whose first record has ``hash_ids``: Mooncake's trace (``simctl.traces.mooncake``): arrivals,
  lengths and the prompt's block identities, for prefix caching.
- Both take an optional integer ``priority`` (CSV column, JSONL key; missing: 0): higher runs first where a
  policy honours priorities (Baton's preemption).
- Both take the prompt's content for prefix caching, optional integers ``prefix_group`` (>= -1; missing: -1,
  no shared prefix) and ``prefix_tokens`` (0..prompt tokens; missing: 0): the first ``prefix_tokens`` prompt
  tokens are the same in every request of the same ``prefix_group`` >= 0, all others are the request's own.

Lengths must be integers >= 1 (an integral float such as ``12.0`` is accepted, since pandas and many
exporters write those); arrival times must be finite, >= 0 and non-decreasing. Any violation raises
``InputError`` naming the file and the 1-based line of the first bad row (the CSV header is line 1).
"""

from __future__ import annotations

import csv
import json
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simctl.common.errors import InputError
from simctl.traces.mooncake import is_mooncake_file, read_mooncake
from simctl.traces.vllm_bench import read_vllm_bench

if TYPE_CHECKING:
    import pandas as pd

CSV_PROMPT, CSV_OUTPUT, CSV_ARRIVAL = "num_prefill_tokens", "num_decode_tokens", "arrived_at"
JSON_PROMPT, JSON_OUTPUT, JSON_ARRIVAL = "prompt_tokens", "output_tokens", "arrival_s"
PRIORITY = "priority"  # optional in both formats: an integer, higher runs first (default 0)
PREFIX_GROUP, PREFIX_TOKENS = "prefix_group", "prefix_tokens"  # optional in both formats (default -1, 0)
SUPPORTED_EXTENSIONS = (".csv", ".jsonl", ".json")
# Guards the int64 conversion; no real request is anywhere near 2^31 tokens.
MAX_TOKENS = 2**31 - 1


@dataclass(frozen=True, slots=True)
class LoadedTrace:
    path: Path
    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # float64, non-decreasing, >= 0; None when the file has no arrivals
    priority: np.ndarray | None = None  # int64; None when the file gives none
    prefix_group: np.ndarray | None = None  # int64, >= -1; None when the file gives none
    prefix_tokens: np.ndarray | None = None  # int64, 0..prompt tokens; None when the file gives none
    hash_ids: tuple[tuple[int, ...], ...] | None = None  # each prompt's block ids (Mooncake); None: not given

    def __len__(self) -> int:
        return len(self.prompt_tokens)

    @property
    def has_arrivals(self) -> bool:
        return self.arrival_s is not None


def load_trace_file(path: str | os.PathLike[str]) -> LoadedTrace:
    p = Path(path)
    ext = p.suffix.lower()
    if ext not in SUPPORTED_EXTENSIONS:
        raise InputError(
            f"trace file {p}: unsupported extension {repr(ext) if ext else '(none)'} "
            f"(expected {' or '.join(SUPPORTED_EXTENSIONS)})"
        )
    if not p.exists():
        raise InputError(f"trace file {p}: not found")
    if not p.is_file():
        raise InputError(f"trace file {p}: not a regular file")
    if ext == ".json":
        bench = read_vllm_bench(p)
        return LoadedTrace(p, bench.prompt_tokens, bench.output_tokens, bench.arrival_s)
    if ext == ".jsonl" and is_mooncake_file(p):
        rows = read_mooncake(p)
        return LoadedTrace(p, rows.prompt_tokens, rows.output_tokens, rows.arrival_s, hash_ids=rows.hash_ids)
    trace = _load_csv(p) if ext == ".csv" else _load_jsonl(p)
    if len(trace) == 0:
        raise InputError(f"trace file {p}: contains no requests")
    return trace


def _fail(path: Path, line: int, msg: str) -> InputError:
    return InputError(f"trace file {path}, line {line}: {msg}")


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_length(path: Path, line: int, name: str, value: float) -> int:
    """Validate one already-numeric length; returns it as int."""
    if not math.isfinite(value):
        raise _fail(path, line, f"{name} is {value}, expected an integer >= 1")
    if value != math.floor(value):
        raise _fail(path, line, f"{name} is {value}, expected an integer number of tokens")
    if value < 1:
        raise _fail(path, line, f"{name} is {int(value)}, expected >= 1")
    if value > MAX_TOKENS:
        raise _fail(path, line, f"{name} is {value:.6g}, larger than {MAX_TOKENS}")
    return int(value)


def _check_priority(path: Path, line: int, value: float) -> int:
    if not (math.isfinite(value) and value == math.floor(value) and abs(value) <= MAX_TOKENS):
        raise _fail(path, line, f"{PRIORITY} is {value}, expected an integer")
    return int(value)


def _check_prefix(path: Path, line: int, group: float, tokens: float, prompt: int) -> tuple[int, int]:
    """A row's prefix_group (an integer >= -1) and prefix_tokens (an integer from 0 to its prompt tokens)."""
    if not (math.isfinite(group) and group == math.floor(group) and -1 <= group <= MAX_TOKENS):
        raise _fail(path, line,
                    f"{PREFIX_GROUP} is {group:g}, expected an integer >= -1 (-1: no shared prefix)")
    if not (math.isfinite(tokens) and tokens == math.floor(tokens) and 0 <= tokens <= prompt):
        raise _fail(path, line, f"{PREFIX_TOKENS} is {tokens:g}, expected an integer from 0 to the prompt's "
                                f"{prompt} tokens")
    return int(group), int(tokens)


def _check_arrivals(path: Path, lines: np.ndarray, name: str, arrivals: np.ndarray) -> None:
    bad = ~np.isfinite(arrivals) | (arrivals < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise _fail(path, int(lines[i]), f"{name} is {arrivals[i]}, expected a finite time >= 0 (seconds)")
    back = np.diff(arrivals) < 0
    if back.any():
        i = int(np.argmax(back)) + 1
        raise _fail(
            path,
            int(lines[i]),
            f"{name} {arrivals[i]} is earlier than {arrivals[i - 1]} on line {lines[i - 1]}; "
            "arrivals must be sorted (non-decreasing)",
        )


# ---------------------------------------------------------------- CSV


def _read_csv(path: Path) -> pd.DataFrame:
    import pandas as pd  # a CSV trace's reader; a length profile's run needs no pandas

    try:
        # Everything as text so that we, not pandas, decide what a bad cell is and which line it is on;
        # blank lines are kept (then dropped below) so that index + 2 is the line number.
        # index_col=False: a row with more fields than the header is not taken for an index column; pandas
        # then warns that it drops the extra fields, and that warning is made the error it is
        with warnings.catch_warnings():
            warnings.simplefilter("error", pd.errors.ParserWarning)
            df = pd.read_csv(path, dtype=str, keep_default_na=False, skip_blank_lines=False, index_col=False)
    except pd.errors.ParserWarning:
        raise _too_many_fields(path) from None
    except pd.errors.EmptyDataError:
        raise InputError(f"trace file {path}: empty file (expected a CSV header and rows)") from None
    except pd.errors.ParserError as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else "malformed CSV"
        raise InputError(f"trace file {path}: malformed CSV: {first}") from None
    except UnicodeDecodeError:
        raise InputError(f"trace file {path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"trace file {path}: cannot read ({e.strerror or e})") from None
    header = _header(path)
    twice = sorted({c for c in header if header.count(c) > 1})
    if twice:
        raise InputError(
            f"trace file {path}: column(s) {', '.join(twice)} appear more than once in the header")
    df.columns = header
    blank = (df.apply(lambda col: col.str.strip()) == "").all(axis=1)
    return df[~blank]


def _too_many_fields(path: Path) -> InputError:
    with path.open(encoding="utf-8", newline="") as f:
        rows = csv.reader(f)
        width = len(next(rows, []))
        for line, row in enumerate(rows, start=2):
            if len(row) > width:
                return _fail(path, line, f"{len(row)} fields, but the header names {width} columns")
    return InputError(f"trace file {path}: a row has more fields than the header names columns")


def _header(path: Path) -> list[str]:
    """The header's column names, stripped, as written (pandas renames a repeated name `name.1`)."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        return [c.strip() for c in next(csv.reader(f), [])]


def _numeric_column(path: Path, df: pd.DataFrame, name: str) -> np.ndarray:
    import pandas as pd

    raw = df[name].str.strip()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    # to_numeric maps both junk and literal 'nan' to NaN: either way the cell is not a usable number.
    bad = np.isnan(values)
    if bad.any():
        i = int(np.argmax(bad))
        cell = raw.iloc[i]
        what = "is empty" if cell == "" else f"is {_short(cell)}, not a number"
        raise _fail(path, int(df.index[i]) + 2, f"{name} {what}")
    return values


def _load_csv(path: Path) -> LoadedTrace:
    df = _read_csv(path)
    missing = [c for c in (CSV_PROMPT, CSV_OUTPUT) if c not in df.columns]
    if missing:
        raise InputError(
            f"trace file {path}: missing column(s) {', '.join(missing)} "
            f"(found: {', '.join(df.columns) or 'none'})"
        )
    lines = df.index.to_numpy() + 2
    columns = {}
    for name in (CSV_PROMPT, CSV_OUTPUT):
        values = _numeric_column(path, df, name)
        ok = np.isfinite(values) & (values == np.floor(values)) & (values >= 1) & (values <= MAX_TOKENS)
        if not ok.all():
            i = int(np.argmax(~ok))
            _check_length(path, int(lines[i]), name, float(values[i]))  # raises with the precise reason
        columns[name] = values.astype(np.int64)
    arrivals = None
    if CSV_ARRIVAL in df.columns:
        arrivals = _numeric_column(path, df, CSV_ARRIVAL)
        _check_arrivals(path, lines, CSV_ARRIVAL, arrivals)
    priority = None
    if PRIORITY in df.columns:
        values = _numeric_column(path, df, PRIORITY)
        for line, v in zip(lines.tolist(), values.tolist()):
            _check_priority(path, line, v)
        priority = values.astype(np.int64)
    groups = tokens = None
    if PREFIX_GROUP in df.columns or PREFIX_TOKENS in df.columns:
        n = len(df)
        group_values = _numeric_column(path, df,
                                       PREFIX_GROUP) if PREFIX_GROUP in df.columns else np.full(n, -1.0)
        token_values = _numeric_column(path, df,
                                       PREFIX_TOKENS) if PREFIX_TOKENS in df.columns else np.zeros(n)
        for line, g, t, p in zip(lines.tolist(), group_values.tolist(), token_values.tolist(),
                                 columns[CSV_PROMPT].tolist()):
            _check_prefix(path, line, g, t, p)
        groups, tokens = group_values.astype(np.int64), token_values.astype(np.int64)
    return LoadedTrace(path, columns[CSV_PROMPT], columns[CSV_OUTPUT], arrivals, priority, groups, tokens)


# ---------------------------------------------------------------- JSONL


def _json_number(path: Path, line: int, obj: dict, key: str) -> float:
    if key not in obj:
        raise _fail(path, line, f"missing key {key!r}")
    value = obj[key]
    # bool is an int subclass in Python; true/false are not lengths.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _fail(path, line, f"{key} is {_short(value)}, not a number")
    try:
        return float(value)
    except OverflowError:  # a JSON integer beyond float range
        raise _fail(path, line, f"{key} is out of range") from None


class _RepeatedKey(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """json.loads keeps a repeated key's last value silently: refuse it, as a repeated CSV column is."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _RepeatedKey(key)
        seen.add(key)
    return dict(pairs)


def _load_jsonl(path: Path) -> LoadedTrace:
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a BOM some editors write
    except UnicodeDecodeError:
        raise InputError(f"trace file {path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"trace file {path}: cannot read ({e.strerror or e})") from None
    prompts: list[int] = []
    outputs: list[int] = []
    arrivals: list[float] = []
    priority: list[int] = []
    prefixes: list[tuple[int, int]] = []
    lines: list[int] = []
    with_arrivals: bool | None = None  # decided by the first record
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw, object_pairs_hook=_unique_keys)
        except json.JSONDecodeError as e:
            raise _fail(path, lineno, f"invalid JSON ({e.msg})") from None
        except _RepeatedKey as e:
            raise _fail(path, lineno, f"key {e.args[0]!r} appears more than once") from None
        if not isinstance(obj, dict):
            raise _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        prompts.append(_check_length(path, lineno, JSON_PROMPT, _json_number(path, lineno, obj, JSON_PROMPT)))
        outputs.append(_check_length(path, lineno, JSON_OUTPUT, _json_number(path, lineno, obj, JSON_OUTPUT)))
        has = JSON_ARRIVAL in obj
        if with_arrivals is None:
            with_arrivals = has
        elif has != with_arrivals:
            state = "has" if has else "lacks"
            raise _fail(
                path,
                lineno,
                f"{state} {JSON_ARRIVAL!r} unlike line {lines[0]}: give it on every line or none",
            )
        if has:
            arrivals.append(_json_number(path, lineno, obj, JSON_ARRIVAL))
        priority.append(_check_priority(path, lineno, _json_number(path, lineno, obj, PRIORITY))
                        if PRIORITY in obj else 0)
        group = _json_number(path, lineno, obj, PREFIX_GROUP) if PREFIX_GROUP in obj else -1.0
        tokens = _json_number(path, lineno, obj, PREFIX_TOKENS) if PREFIX_TOKENS in obj else 0.0
        prefixes.append(_check_prefix(path, lineno, group, tokens, prompts[-1]))
        lines.append(lineno)
    if not lines:
        raise InputError(f"trace file {path}: empty file (expected one JSON object per line)")
    arr = None
    if with_arrivals:
        arr = np.asarray(arrivals, dtype=np.float64)
        _check_arrivals(path, np.asarray(lines), JSON_ARRIVAL, arr)
    shared = any(p != (-1, 0) for p in prefixes)
    groups, tokens = (np.asarray(v, dtype=np.int64) for v in zip(*prefixes)) if shared else (None, None)
    return LoadedTrace(path, np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64), arr,
                       np.asarray(priority, dtype=np.int64) if any(priority) else None, groups, tokens)
