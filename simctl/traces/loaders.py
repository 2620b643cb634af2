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
- Sessions (conversations; ``simctl.traces.sessions``): a file with a ``session_id`` column (JSONL: key, on
  every line or none; any string or integer) holds one turn per row. Instead of the prompt it gives the turn's
  new tokens, ``num_new_tokens`` (CSV) or ``new_tokens`` (JSONL), with its output length as usual and an
  optional ``think_s``, the seconds from the previous turn's completion to its send (empty or absent: 0; none
  on a session's first row). A turn follows the row of its session above it; its prompt is the session's
  earlier new and output tokens plus its own new ones (with a ``prefix_group``, ``prefix_tokens`` count in
  that whole prompt). The arrival column, if any, is given on each session's first row only (sorted over
  those rows) and on no later one. Rows come back in request order: each session's turns together, sessions
  by first row, every turn's ``arrival_s`` its session's start.

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
from simctl.traces.row_checks import (
    MAX_TOKENS,
    PREFIX_GROUP,
    PREFIX_TOKENS,
    PRIORITY,
    check_arrivals,
    check_length,
    check_prefix,
    check_priority,
    fail,
    short,
)
from simctl.traces.sessions import CSV_NEW, JSON_NEW, SESSION_ID, THINK, FileTurns, file_turns
from simctl.traces.vllm_bench import read_vllm_bench

if TYPE_CHECKING:
    import pandas as pd

CSV_PROMPT, CSV_OUTPUT, CSV_ARRIVAL = "num_prefill_tokens", "num_decode_tokens", "arrived_at"
JSON_PROMPT, JSON_OUTPUT, JSON_ARRIVAL = "prompt_tokens", "output_tokens", "arrival_s"
SUPPORTED_EXTENSIONS = (".csv", ".jsonl", ".json")


@dataclass(frozen=True, slots=True)
class LoadedTrace:
    path: Path
    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray | None  # float64, non-decreasing, >= 0; None when the file has no arrivals
    priority: np.ndarray | None = None  # int64; None when the file gives none
    prefix_group: np.ndarray | None = None  # int64, >= -1; None when the file gives none
    prefix_tokens: np.ndarray | None = None  # int64, 0..prompt tokens; None when the file gives none
    # a session file's (each session's turns together, in order; `arrival_s` its session's start): the
    # session of each turn (0, 1, ... by first turn), its new tokens and its think time; else None
    session: np.ndarray | None = None
    new_tokens: np.ndarray | None = None
    think_s: np.ndarray | None = None
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
                return fail(path, line, f"{len(row)} fields, but the header names {width} columns")
    return InputError(f"trace file {path}: a row has more fields than the header names columns")


def _header(path: Path) -> list[str]:
    """The header's column names, stripped, as written (pandas renames a repeated name `name.1`)."""
    with path.open(encoding="utf-8-sig", newline="") as f:
        return [c.strip() for c in next(csv.reader(f), [])]


def _numeric_column(path: Path, df: pd.DataFrame, name: str, blank_ok: bool = False) -> np.ndarray:
    """The column's numbers; an empty cell is NaN where `blank_ok`, else an error as a non-number is."""
    import pandas as pd

    raw = df[name].str.strip()
    values = pd.to_numeric(raw, errors="coerce").to_numpy(dtype=np.float64)
    # to_numeric maps both junk and literal 'nan' to NaN: either way the cell is not a usable number.
    bad = np.isnan(values) & ~((raw == "").to_numpy() if blank_ok else False)
    if bad.any():
        i = int(np.argmax(bad))
        cell = raw.iloc[i]
        what = "is empty" if cell == "" else f"is {short(cell)}, not a number"
        raise fail(path, int(df.index[i]) + 2, f"{name} {what}")
    return values


def _load_csv(path: Path) -> LoadedTrace:
    df = _read_csv(path)
    sessions = SESSION_ID in df.columns
    wrong = _session_keys(set(df.columns), sessions, CSV_PROMPT, CSV_NEW)
    if wrong:
        raise InputError(f"trace file {path}: {wrong}")
    prompt = CSV_NEW if sessions else CSV_PROMPT
    missing = [c for c in (prompt, CSV_OUTPUT) if c not in df.columns]
    if missing:
        raise InputError(
            f"trace file {path}: missing column(s) {', '.join(missing)} "
            f"(found: {', '.join(df.columns) or 'none'})"
        )
    lines = df.index.to_numpy() + 2
    columns = {}
    for name in (prompt, CSV_OUTPUT):
        values = _numeric_column(path, df, name)
        ok = np.isfinite(values) & (values == np.floor(values)) & (values >= 1) & (values <= MAX_TOKENS)
        if not ok.all():
            i = int(np.argmax(~ok))
            check_length(path, int(lines[i]), name, float(values[i]))  # raises with the precise reason
        columns[name] = values.astype(np.int64)
    arrivals = _numeric_column(path, df, CSV_ARRIVAL, sessions) if CSV_ARRIVAL in df.columns else None
    turns = None
    if sessions:
        labels = df[SESSION_ID].str.strip()
        if (labels == "").any():
            raise fail(path, int(lines[int(np.argmax((labels == "").to_numpy()))]), f"{SESSION_ID} is empty")
        think = _numeric_column(path, df, THINK, True) if THINK in df.columns else np.full(len(df), np.nan)
        turns = file_turns(path, lines, labels.tolist(), columns[prompt], columns[CSV_OUTPUT], think,
                           arrivals, CSV_ARRIVAL)
    elif arrivals is not None:
        check_arrivals(path, lines, CSV_ARRIVAL, arrivals)
    prompts = columns[prompt] if turns is None else turns.prompt_tokens
    priority = None
    if PRIORITY in df.columns:
        values = _numeric_column(path, df, PRIORITY)
        for line, v in zip(lines.tolist(), values.tolist()):
            check_priority(path, line, v)
        priority = values.astype(np.int64)
    groups = tokens = None
    if PREFIX_GROUP in df.columns or PREFIX_TOKENS in df.columns:
        n = len(df)
        group_values = _numeric_column(path, df,
                                       PREFIX_GROUP) if PREFIX_GROUP in df.columns else np.full(n, -1.0)
        token_values = _numeric_column(path, df,
                                       PREFIX_TOKENS) if PREFIX_TOKENS in df.columns else np.zeros(n)
        for line, g, t, p in zip(lines.tolist(), group_values.tolist(), token_values.tolist(),
                                 prompts.tolist()):
            check_prefix(path, line, g, t, p)
        groups, tokens = group_values.astype(np.int64), token_values.astype(np.int64)
    return _assembled(LoadedTrace(path, prompts, columns[CSV_OUTPUT], arrivals, priority, groups, tokens),
                      columns[prompt], turns)


def _session_keys(present: set[str], sessions: bool, prompt: str, new: str) -> str | None:
    """What is wrong with a row's (CSV: the header's) names as to sessions, or None."""
    if sessions and prompt in present:
        return (f"{prompt} given with {SESSION_ID}: a session's turn gives its new tokens ({new}), its "
                "prompt is its session's context plus them")
    extra = [k for k in (new, THINK) if k in present]
    if not sessions and extra:
        return f"{', '.join(extra)} describe(s) a session's turn: give {SESSION_ID} too"
    return None


def _assembled(trace: LoadedTrace, new: np.ndarray, turns: FileTurns | None) -> LoadedTrace:
    """`trace` as loaded, or, for a session file (`turns`), its rows in request order with their sessions:
    each session's turns together, sessions by first turn, every turn arriving at its session's start."""
    if turns is None:
        return trace
    o = turns.order
    session = turns.session[o]
    return LoadedTrace(
        trace.path, trace.prompt_tokens[o], trace.output_tokens[o],
        None if turns.starts is None else turns.starts[session],
        *(None if a is None else a[o] for a in (trace.priority, trace.prefix_group, trace.prefix_tokens)),
        session=session, new_tokens=new[o], think_s=turns.think_s[o])


# ---------------------------------------------------------------- JSONL


def _json_number(path: Path, line: int, obj: dict, key: str) -> float:
    if key not in obj:
        raise fail(path, line, f"missing key {key!r}")
    value = obj[key]
    # bool is an int subclass in Python; true/false are not lengths.
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise fail(path, line, f"{key} is {short(value)}, not a number")
    try:
        return float(value)
    except OverflowError:  # a JSON integer beyond float range
        raise fail(path, line, f"{key} is out of range") from None


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


def _json_object(path: Path, line: int, raw: str) -> dict:
    try:
        obj = json.loads(raw, object_pairs_hook=_unique_keys)
    except json.JSONDecodeError as e:
        raise fail(path, line, f"invalid JSON ({e.msg})") from None
    except _RepeatedKey as e:
        raise fail(path, line, f"key {e.args[0]!r} appears more than once") from None
    if not isinstance(obj, dict):
        raise fail(path, line, f"expected a JSON object, got {type(obj).__name__}")
    return obj


@dataclass(frozen=True, slots=True)
class _Row:
    """One JSONL line's values; NaN where an optional number is not given."""

    line: int
    session: str | int | None
    tokens: int  # the prompt's, or a session turn's new tokens
    output: int
    arrival: float
    think: float
    priority: int
    group: float
    prefix: float


def _json_row(path: Path, line: int, obj: dict, first: _Row | None) -> _Row:
    """The line's values, its keys consistent with the `first` line's (None: it is the first)."""
    sessions = SESSION_ID in obj if first is None else first.session is not None
    if first is not None:
        given = {SESSION_ID: sessions, JSON_ARRIVAL: not math.isnan(first.arrival)}
        if sessions:  # only a session's first turn gives an arrival time (`file_turns` checks)
            del given[JSON_ARRIVAL]
        for key, expected in given.items():
            if (key in obj) != expected:
                state = "has" if key in obj else "lacks"
                raise fail(path, line, f"{state} {key!r} unlike line {first.line}: give it on every line or "
                                       "none")
    wrong = _session_keys(set(obj), sessions, JSON_PROMPT, JSON_NEW)
    if wrong:
        raise fail(path, line, wrong)
    label = obj.get(SESSION_ID)
    if sessions and (isinstance(label, bool) or not isinstance(label, (str, int))):
        raise fail(path, line, f"{SESSION_ID} is {short(label)}, expected a string or an integer")
    name = JSON_NEW if sessions else JSON_PROMPT

    def number(key: str, missing: float) -> float:
        if key not in obj:
            return missing
        value = _json_number(path, line, obj, key)
        if math.isnan(value):  # JSON's NaN literal: NaN stands for a key not given here
            raise fail(path, line, f"{key} is nan, not a number")
        return value

    return _Row(line, label, check_length(path, line, name, _json_number(path, line, obj, name)),
                check_length(path, line, JSON_OUTPUT, _json_number(path, line, obj, JSON_OUTPUT)),
                number(JSON_ARRIVAL, math.nan), number(THINK, math.nan),
                check_priority(path, line, number(PRIORITY, 0.0)), number(PREFIX_GROUP, -1.0),
                number(PREFIX_TOKENS, 0.0))


def _load_jsonl(path: Path) -> LoadedTrace:
    try:
        text = path.read_text(encoding="utf-8-sig")  # -sig: tolerate a BOM some editors write
    except UnicodeDecodeError:
        raise InputError(f"trace file {path}: not UTF-8 text") from None
    except OSError as e:
        raise InputError(f"trace file {path}: cannot read ({e.strerror or e})") from None
    rows: list[_Row] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if raw.strip():
            rows.append(_json_row(path, lineno, _json_object(path, lineno, raw), rows[0] if rows else None))
    if not rows:
        raise InputError(f"trace file {path}: empty file (expected one JSON object per line)")
    lines = np.asarray([r.line for r in rows])
    lengths = np.asarray([r.tokens for r in rows], dtype=np.int64)
    outputs = np.asarray([r.output for r in rows], dtype=np.int64)
    arr = np.asarray([r.arrival for r in rows], dtype=np.float64)
    arr = None if np.isnan(arr).all() else arr  # a session's later turns give none, others all or none
    turns = None
    if rows[0].session is not None:
        turns = file_turns(path, lines, [r.session for r in rows], lengths, outputs,
                           np.asarray([r.think for r in rows], dtype=np.float64), arr, JSON_ARRIVAL)
    elif arr is not None:
        check_arrivals(path, lines, JSON_ARRIVAL, arr)
    prompts = lengths if turns is None else turns.prompt_tokens
    prefixes = [check_prefix(path, r.line, r.group, r.prefix, p) for r, p in zip(rows, prompts.tolist())]
    shared = any(p != (-1, 0) for p in prefixes)
    groups, tokens = (np.asarray(v, dtype=np.int64) for v in zip(*prefixes)) if shared else (None, None)
    priority = [r.priority for r in rows]
    return _assembled(LoadedTrace(path, prompts, outputs, arr, np.asarray(priority, dtype=np.int64)
                                  if any(priority) else None, groups, tokens), lengths, turns)
