"""Run a sweep's points (studies/sweep_spec.py) in parallel, each cached by its key, and gather them in a
table.

Each finished point is written at once to `DIR/points/KEY.json` (atomically: a temporary renamed into place),
so an interrupted sweep, run again, computes only the points it lacks. The points run in a local process pool
(workers ignore SIGINT, as capacity's: the parent stops them), or as Ray tasks when given a Ray address.
`sweep.parquet` has one row per point and SLO (a run point judged against each of the file's SLOs; a capacity
point under its SLO), `probes.parquet` every probed run of the capacity points.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from simctl.common.children import stop_pool
from simctl.common.errors import InputError
from simctl.results.output import atomic_write, json_text, write_files
from simctl.results.slo import SLO
from simctl.sim.run import run
from simctl.studies.capacity import (  # _quiet_worker: capacity's pool workers: signals are the parent's
    _quiet_worker,
    find_capacity,
    probe_row,
)
from simctl.studies.goodput import find_goodput
from simctl.studies.sweep_spec import SweepPoint

if TYPE_CHECKING:
    from simctl.serving.records import RequestTable

SWEEP_FILES = ("sweep.parquet", "probes.parquet")
POINTS_DIR = "points"
AT_CAPACITY = ("ttft_p50", "tbt_p99", "tpot_p50", "e2e_p50", "throughput_tokens_per_s", "sched_delay_p50",
               "rejected")  # requests refused as too long (absent: every request fit)


def _judged(summary: dict[str, Any], slo: SLO, requests: RequestTable) -> dict[str, Any]:
    share = ({"slo_attainment": slo.attainment_of(requests, summary.get("rejected", 0))}
             if slo.per_request else {})
    required = {"attainment": slo.attainment} if slo.per_request else {}
    return {**share, **required, "slo_met": slo.met({**summary, **share})}


def compute_point(point: SweepPoint) -> dict[str, Any]:
    """A point's record: its table rows (and, for a capacity point, every probe), JSON-ready."""
    labels = point.labels
    if point.mode == "run":
        r = run(point.config, point.cluster)
        summary = {k: v for k, v in r.summary.items() if k not in ("warnings", "options")}
        judged = [{"slo": name, "slo_text": slo.describe(), **_judged(summary, slo, r.result.request_columns)}
                  for name, slo in point.slos.items()] or [{"slo": None}]
        rows = [{**summary, **labels, "mode": "run", **j} for j in judged]
        return {"key": point.key, "rows": rows, "probes": [], "warnings": r.summary.get("warnings", [])}
    (name, slo), = point.slos.items()
    per_gpu = {}
    if point.cluster.is_cluster:  # the deployment's rate, and per GPU (DistServe's goodput)
        g = find_goodput(point.config.with_workload(qps=point.start_qps), point.cluster, slo, point.start_qps)
        found, per_gpu = g.search, {"gpus": g.gpus, "capacity_qps_per_gpu": g.per_gpu}
    else:
        found = find_capacity(point.config, slo, point.start_qps)
    at = found.at_capacity or {}
    row = {**labels, "mode": "capacity", "slo": name, "slo_text": slo.describe(), "capacity_qps": found.qps,
           **per_gpu,
           "problem": found.problem, "bound_by": ",".join(found.bound_by), "probes": len(found.probes),
           **{k: at.get(k) for k in AT_CAPACITY}}
    probes = [{**probe_row(p, ("warnings", "options")), **labels, "slo": name,
               **({"attainment": slo.attainment} if slo.per_request else {})}
              for p in found.probes]
    return {"key": point.key, "rows": [row], "probes": probes, "warnings": found.warnings}


def _compute_and_store(args: tuple[SweepPoint, str]) -> dict[str, Any]:
    """In a worker: compute a point and write its record (so that it survives an interruption of the rest)."""
    point, folder = args
    record = compute_point(point)
    text = json_text(record)
    atomic_write(Path(folder) / f"{point.key}.json", lambda p: p.write_text(text, encoding="utf-8"))
    return record


def cached(folder: Path, point: SweepPoint) -> dict[str, Any] | None:
    """A finished point's record, or None (absent, or unreadable: it is then computed again)."""
    try:
        record = json.loads((folder / f"{point.key}.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("key") == point.key else None


def _local(jobs: list[tuple[SweepPoint, str]], workers: int) -> Iterator[dict[str, Any]]:
    if workers == 1:
        yield from map(_compute_and_store, jobs)
        return
    from multiprocessing import Pool

    pool = Pool(workers, initializer=_quiet_worker)
    try:
        yield from pool.imap_unordered(_compute_and_store, jobs)
        pool.close()
    finally:
        stop_pool(pool)  # bounded: Ctrl-C must not wait on a worker that takes long to die


RAY_CONNECT_TIMEOUT_S = 5.0


def _check_reachable(address: str) -> None:
    """Ray retries an address that does not answer for minutes: try its port once first ('auto' and 'local'
    name a cluster on this machine, which Ray finds or starts itself)."""
    import socket

    if address in ("auto", "local"):
        return
    host, sep, port = address.removeprefix("ray://").rpartition(":")
    if not sep or not port.isdigit():
        raise InputError(f"--ray {address!r}: give HOST:PORT, ray://HOST:PORT, auto or local")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=RAY_CONNECT_TIMEOUT_S).close()
    except OSError as e:
        raise InputError(f"--ray {address}: nothing answers there ({e.strerror or e})") from None


def check_ray(address: str) -> None:
    """Before anything is created: Ray is installed and something answers at `address`."""
    try:
        import ray  # noqa: F401 - an optional extra
    except ImportError:
        raise InputError("--ray needs Ray: pip install 'simctl[ray]'") from None
    _check_reachable(address)


def _ray(jobs: list[tuple[SweepPoint, str]], address: str) -> Iterator[dict[str, Any]]:
    import ray

    try:
        ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    except Exception as e:  # noqa: BLE001 - ray raises many types for an address that does not answer
        raise InputError(f"--ray {address}: cannot connect ({type(e).__name__}: {str(e).splitlines()[0]})"
                         ) from None
    try:
        task = ray.remote(_compute_and_store)
        pending = [task.remote(job) for job in jobs]
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            yield ray.get(done[0])
    finally:
        ray.shutdown()


@dataclass
class SweepResult:
    table: pd.DataFrame  # one row per point and SLO
    probes: pd.DataFrame  # every probe of the capacity points
    reused: int  # points read from the cache
    warnings: list[str]  # the cost models' warnings, each once


def run_sweep(points: list[SweepPoint], out: Path, workers: int = 1, ray_address: str | None = None,
              progress: Callable[[int, int], None] | None = None) -> SweepResult:
    """Compute the points not cached in `out/points`, then write sweep.parquet and probes.parquet (all or
    none)."""
    if ray_address:
        check_ray(ray_address)
    folder = Path(out) / POINTS_DIR
    created = [d for d in (folder, *folder.parents) if not d.exists()]  # deepest first
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot create {folder} ({e.strerror or e})") from None
    try:
        return _run(points, Path(out), folder, workers, ray_address, progress)
    except BaseException:
        for d in created:  # nothing finished: the folders this call made go again
            try:
                d.rmdir()
            except OSError:  # it holds finished points: they are kept for the next run
                break
        raise


def _run(points: list[SweepPoint], out: Path, folder: Path, workers: int, ray_address: str | None,
         progress: Callable[[int, int], None] | None) -> SweepResult:
    records = {p.key: cached(folder, p) for p in points}
    todo = [(p, str(folder)) for p in points if records[p.key] is None]
    reused = len(points) - len(todo)
    if progress:
        progress(reused, len(points))
    results = _ray(todo, ray_address) if ray_address else _local(todo, min(workers, max(len(todo), 1)))
    for i, record in enumerate(results, 1):
        records[record["key"]] = record
        if progress:
            progress(reused + i, len(points))
    ordered = [records[p.key] for p in points]
    table = pd.DataFrame([row for r in ordered for row in r["rows"]])
    probes = pd.DataFrame([p for r in ordered for p in r["probes"]])
    write_files(Path(out), {"sweep.parquet": lambda p: table.to_parquet(p, index=False),
                            "probes.parquet": lambda p: probes.to_parquet(p, index=False)},
                "the sweep's table")
    return SweepResult(table, probes, reused,
                       list(dict.fromkeys(w for r in ordered for w in r["warnings"])))
