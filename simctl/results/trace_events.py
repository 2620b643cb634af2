"""A run's iterations as a Chrome / Perfetto trace (the JSON trace event format), for `simctl run
--trace-events FILE.json`: open it in ui.perfetto.dev or chrome://tracing.

One "X" (complete) event per iteration row (a stretch of identical decode iterations is one event, `count`
in its args), with `ts`/`dur` in microseconds of simulated time, on the replica's process (pid 0, tid 0), and
a "C" (counter) event of the KV slots in use. At most MAX_EVENTS rows are written (the first ones): a trace
viewer loads a few hundred thousand events comfortably, and the parquet rows hold the whole run.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from simctl.common.errors import InputError
from simctl.results.output import check_out_file, file_ends, write_files

if TYPE_CHECKING:
    import pandas as pd

MAX_EVENTS = 200_000


def _name(prefill: int, decode: int, count: int) -> str:
    if prefill and decode:
        return "hybrid"
    if prefill:
        return "prefill"
    return f"decode x{count}" if count > 1 else "decode"


def trace_events(iterations: pd.DataFrame, summary: dict[str, Any]) -> dict[str, Any]:
    """The trace as a JSON-ready dict; `otherData` says when rows were left out."""
    its = iterations.sort_values("start_s", kind="stable").head(MAX_EVENTS)
    start = its["start_s"].to_numpy(float) * 1e6
    end = (its["start_s"].to_numpy(float) + its["duration_s"].to_numpy(float)) * 1e6
    # rows follow each other exactly; rounding of start + duration must not overlap the next one
    end = np.minimum(end, np.append(start[1:], np.inf))
    label = f"replica 0: {summary.get('policy')} on {summary.get('gpu')} x{summary.get('tp')}"
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": 0, "tid": 0, "args": {"name": label}},
        {"ph": "M", "name": "thread_name", "pid": 0, "tid": 0, "args": {"name": "iterations"}},
    ]
    columns = ("count", "batch_size", "prefill_tokens", "decode_tokens", "linear_tokens", "kv_used_tokens")
    values = [its[c].to_numpy(np.int64).tolist() for c in columns]
    for ts, te, row in zip(start.tolist(), end.tolist(), zip(*values)):
        args = dict(zip(columns, row))
        events.append({"ph": "X", "name": _name(args["prefill_tokens"], args["decode_tokens"], args["count"]),
                       "cat": "iteration", "pid": 0, "tid": 0, "ts": ts, "dur": te - ts, "args": args})
        events.append({"ph": "C", "name": "KV slots in use", "pid": 0, "ts": ts,
                       "args": {"tokens": args["kv_used_tokens"]}})
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"policy": summary.get("policy"), "model": summary.get("model"),
                          "gpu": summary.get("gpu"), "trace": summary.get("trace"),
                          "rows": len(iterations), "rows_written": len(its),
                          "truncated": len(its) < len(iterations), "max_events": MAX_EVENTS}}


def is_trace_events(path: Path) -> bool:
    """Whether `path` holds trace events this module wrote (its first key, and `otherData` at its end)."""
    head, tail = file_ends(path)
    return head.startswith(b'{"traceEvents":') and b'"max_events":' in tail


def check_trace_path(path: Path, inputs: dict[str, Any] | None = None) -> None:
    """Refuse, before the run, a path the trace cannot be written to, one of the run's `inputs` (option ->
    path), or an existing file that is not an earlier trace (`--out`'s rule, `check_out_file`)."""
    if path.is_dir():
        raise InputError(
            f"--trace-events {path}: is a folder; give a file name such as {path / 'trace.json'}")
    check_out_file(path, "--trace-events", "trace-events file", is_trace_events, inputs)


def write_trace_events(path: Path, iterations: pd.DataFrame, summary: dict[str, Any]) -> bool:
    """Write the trace (all or nothing); whether rows were left out (MAX_EVENTS)."""
    trace = trace_events(iterations, summary)
    text = json.dumps(trace, separators=(",", ":"), allow_nan=False)
    write_files(path.parent, {path.name: lambda p: p.write_text(text, encoding="utf-8")}, "the trace events")
    return bool(trace["otherData"]["truncated"])
