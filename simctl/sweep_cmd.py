"""`simctl sweep SWEEP.toml --out DIR`: a grid of fixed-rate runs or capacity searches, in parallel,
resumable."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from simctl.common.errors import InputError


def sweep(
    spec_file: Annotated[Path, typer.Argument(help="The sweep file (TOML): mode, num_requests, seeds, [grid] "
                                              "and [slo]; see the README.")],
    out: Annotated[Path, typer.Option(help="Folder for sweep.parquet, probes.parquet and points/ (one cached "
                                      "result per point: run again to resume).")],
    workers: Annotated[int | None, typer.Option(help="Local processes [default: one per core].")] = None,
    ray: Annotated[str | None, typer.Option("--ray", help="Run the points as tasks on this Ray cluster "
                                            "(e.g. auto, or ray://host:10001) instead of a local "
                                            "pool.")] = None,
) -> None:
    """Run every point of a grid (policies, traces, models, GPUs, TP, policy settings, seeds, SLOs): a run at
    each rate, or a capacity search under each SLO.

    Example: simctl sweep bench/sweep_100.toml --out out/sweep --workers 2
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    from simctl.results.output import check_out_dir
    from simctl.studies.sweep import POINTS_DIR, SWEEP_FILES, run_sweep
    from simctl.studies.sweep_spec import read_sweep, sweep_points
    from simctl.usage_errors import warn_all

    if workers is not None and workers < 1:
        raise InputError(f"--workers must be >= 1, got {workers}")
    if workers is not None and ray is not None:
        raise InputError("give --workers (a local pool) or --ray (a Ray cluster), not both")
    points = sweep_points(read_sweep(spec_file))
    check_out_dir(out, SWEEP_FILES, (POINTS_DIR,))
    with Progress(TextColumn("sweep points"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  TextColumn("ETA"), TimeRemainingColumn(), console=Console(stderr=True), transient=True,
                  disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task("sweep", total=len(points))
        result = run_sweep(points, out, workers or os.cpu_count() or 1, ray,
                           lambda done, total: bar.update(task, completed=done, total=total))
    warn_all(result.warnings)
    Console().print(escape(f"{len(points)} points ({result.reused} from {out}/{POINTS_DIR}, "
                           f"{len(points) - result.reused} computed): wrote {out}/sweep.parquet "
                           f"({len(result.table)} rows) and probes.parquet ({len(result.probes)} probes)"))
