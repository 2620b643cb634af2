"""What `simctl plot` reads: the output folders of `simctl run`, `simctl capacity` and `simctl sweep`.

A run folder (summary.json, requests.parquet, iterations.parquet, and timeline.parquet when the run recorded
one) gives latency distributions and iteration rows; a capacity folder (capacity.json, probes.csv) gives each
policy's capacity under one SLO and every probed run; a sweep folder (sweep.parquet, probes.parquet) gives
both for every point of its grid. Each loader raises InputError naming the folder and what it lacks.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simctl.common.errors import InputError

RUN_KIND, CAPACITY_KIND, SWEEP_KIND = "run", "capacity", "sweep"
_MARKERS = {RUN_KIND: "summary.json", CAPACITY_KIND: "capacity.json", SWEEP_KIND: "sweep.parquet"}
LABELS = ("policy", "trace", "model", "gpu", "tp")  # what names a point in a legend or a title


@dataclass
class RunOutput:
    path: Path
    summary: dict[str, Any]
    requests: pd.DataFrame
    iterations: pd.DataFrame
    timeline: pd.DataFrame | None  # per-request rows of the first iterations (`simctl run --timeline N`)


def folder_kind(path: Path) -> str:
    path = Path(path)
    if not path.is_dir():
        raise InputError(f"{path}: not a folder (give the --out folder of simctl run, capacity or sweep)")
    for kind, marker in _MARKERS.items():
        if (path / marker).is_file():
            return kind
    raise InputError(f"{path}: holds no simctl output (summary.json of a run, capacity.json of a capacity "
                     "search or sweep.parquet of a sweep)")


def _read(path: Path, what: str) -> Any:
    """Read one file, any failure (missing, truncated, not that format) as one line naming it."""
    try:
        if path.suffix == ".json":
            return json.loads(path.read_text(encoding="utf-8"))
        if path.suffix == ".csv":
            return pd.read_csv(path)
        return pd.read_parquet(path)
    except FileNotFoundError:
        raise InputError(f"{path.parent}: {path.name} is missing ({what})") from None
    except Exception as e:  # noqa: BLE001 - any parse failure is the user's file, reported in one line
        raise InputError(f"{path}: cannot read {what} ({type(e).__name__}: {e})") from None


def load_run(path: Path) -> RunOutput:
    path = Path(path)
    if folder_kind(path) != RUN_KIND:
        raise InputError(f"{path}: this figure needs a run's folder (simctl run --out), not a "
                         f"{folder_kind(path)} folder")
    timeline = path / "timeline.parquet"
    return RunOutput(path, _read(path / "summary.json", "the run's summary"),
                     _read(path / "requests.parquet", "the run's requests"),
                     _read(path / "iterations.parquet", "the run's iterations"),
                     _read(timeline, "the run's timeline") if timeline.is_file() else None)


def slo_label(name: str, text: str) -> str:
    """How a figure names an SLO: its name and its limits ('strict: P99 TBT <= 0.1 s, ...')."""
    return f"{name}: {text}" if text and text != name else str(name)


def _capacity_folder(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """capacity.json's rows (one per policy and SLO, the median over seeds and its spread) and the probes."""
    cap = _read(path / "capacity.json", "the capacity results")
    probes = _read(path / "probes.parquet", "the probed runs")
    try:
        slos = cap["slos"]
        labels = {name: slo_label(name, slo.get("text", "")) for name, slo in slos.items()}
        rows = [{**{k: r[k] for k in LABELS}, "slo": labels[r["slo"]], "capacity_qps": r["capacity_qps"],
                 "capacity_qps_min": r["capacity_qps_min"], "capacity_qps_max": r["capacity_qps_max"],
                 "problem": next(iter(r["problems"].values()), None)} for r in cap["capacity"]]
        required = {name: slo["attainment"] for name, slo in slos.items() if slo.get("per_request")}
    except (KeyError, TypeError, AttributeError) as e:
        raise InputError(f"{path}/capacity.json: not a capacity result of this version (no {e})") from None
    if "slo" in probes.columns:
        probes["attainment"] = probes["slo"].map(required)  # what the share must reach, per-request SLOs only
        probes["slo"] = probes["slo"].map(labels)
    return pd.DataFrame(rows), probes


def _sweep_folder(path: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Capacity rows over seeds (median_low, as simctl capacity, with the range) and every run or probe; a
    policy swept over its settings is named with them."""
    table = _read(path / "sweep.parquet", "the sweep's points")
    probes = _read(path / "probes.parquet", "the capacity probes")
    if "mode" not in table.columns:
        raise InputError(f"{path}/sweep.parquet: not a sweep table (no mode column)")
    for frame in (table, probes):
        if len(frame):
            frame["policy"] = frame["variant"]  # the policy with the grid's settings it took
            if "slo_text" in frame.columns:
                frame["slo"] = [slo_label(n, t) if isinstance(n, str) else None
                                for n, t in zip(frame["slo"], frame["slo_text"])]
    if len(probes) and "slo" in probes.columns:  # probes name their SLO only
        texts = dict(zip(table["slo"].str.split(":").str[0], table["slo"])) if "slo" in table.columns else {}
        probes["slo"] = probes["slo"].map(lambda n: texts.get(n, n))
    runs = table[table["mode"] == RUN_KIND]
    caps = table[table["mode"] == CAPACITY_KIND]
    if len(caps):
        caps = (caps.groupby([*LABELS, "slo"], sort=False, dropna=False)
                .agg(capacity_qps=("capacity_qps", lambda q: float(np.sort(q)[(len(q) - 1) // 2])),
                     capacity_qps_min=("capacity_qps", "min"), capacity_qps_max=("capacity_qps", "max"),
                     problem=("problem", lambda p: next((x for x in p if x), None)))
                .reset_index())
    return caps, pd.concat([runs, probes], ignore_index=True)


def load_results(paths: list[Path]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(capacities, points) over every folder: capacities has one row per policy and SLO (columns LABELS, slo,
    capacity_qps, problem); points one row per run, probe or fixed-rate sweep point (the summary's
    columns)."""
    caps, points = [], []
    for path in paths:
        kind = folder_kind(Path(path))
        if kind == RUN_KIND:
            points.append(pd.DataFrame([_read(Path(path) / "summary.json", "the run's summary")]))
        elif kind == CAPACITY_KIND:
            c, p = _capacity_folder(Path(path))
            caps.append(c), points.append(p)
        else:
            c, p = _sweep_folder(Path(path))
            caps.append(c), points.append(p)
    nonempty = [f for f in caps if len(f)]
    return (pd.concat(nonempty, ignore_index=True) if nonempty else pd.DataFrame(),
            pd.concat(points, ignore_index=True) if points else pd.DataFrame())


def setup_text(rows: pd.DataFrame, keys: tuple[str, ...] = LABELS[1:]) -> str:
    """What the rows share (e.g. 'mistral-7b on a100-80gb x1, sharegpt'), for a title; '' where they
    differ."""
    shared = {k: rows[k].iloc[0] for k in keys if k in rows.columns and rows[k].nunique(dropna=False) == 1}
    parts = []
    if "model" in shared:
        parts.append(str(shared["model"]))
    if "gpu" in shared:
        parts.append(f"on {shared['gpu']}" + (f" x{int(shared['tp'])}" if "tp" in shared else ""))
    if "trace" in shared:
        parts.append(f"trace {Path(str(shared['trace'])).name}")
    return ", ".join(parts)
