"""Write a run's outputs so that nothing is ever half-written: each file goes to a temporary name in the
target folder and is renamed into place only once complete."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from simctl.errors import InputError


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(Path(tmp))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def prepare_out_dir(out: Path) -> Path:
    """Create the output folder (before any work, so a bad path fails fast)."""
    if out.exists() and not out.is_dir():
        raise InputError(f"--out {out}: exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot create directory ({e.strerror})") from None
    return out


def write_run(out: Path, summary: dict[str, Any], requests: pd.DataFrame, iterations: pd.DataFrame) -> None:
    atomic_write(out / "requests.parquet", lambda p: requests.to_parquet(p, index=False))
    atomic_write(out / "iterations.parquet", lambda p: iterations.to_parquet(p, index=False))
    atomic_write(out / "summary.json", lambda p: p.write_text(json_text(summary)))
