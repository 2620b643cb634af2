"""Write a run's outputs so that nothing is ever half-written: each file goes to a temporary name in the
target folder and is renamed into place only once complete.

`write_run` writes all three files to temporary names first and renames them only when every one of them is
complete (summary.json last, so its presence marks a finished run): a run that fails, or is interrupted,
leaves the folder as it was, including any files of an earlier run.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from common.errors import InputError


def _temp_in(folder: Path, name: str) -> Path:
    """A new, empty, uniquely named file next to `name`. Created with mode 0o666 less the umask (not
    mkstemp's 0o600), so the renamed file gets the permissions a plain write would have given it."""
    while True:
        tmp = folder / f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp"
        try:
            os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        except FileExistsError:
            continue
        return tmp


def atomic_write(path: Path, write: Callable[[Path], None]) -> None:
    tmp = _temp_in(path.parent, path.name)
    try:
        write(tmp)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def json_text(data: dict[str, Any]) -> str:
    return json.dumps(data, indent=2, allow_nan=False) + "\n"


def _oserror_text(e: OSError) -> str:
    return e.strerror or str(e)


def check_out_dir(out: Path) -> Path:
    """Check, without creating anything, that `out` is (or can be made) a writable folder; raise InputError
    if not. Called before the run so that a bad path fails fast and a failed run leaves no trace."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--out {out}: exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise InputError(f"--out {out}: directory is not writable")
        return out
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"--out {out}: cannot create directory ({parent} is not a directory)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"--out {out}: cannot create directory ({parent} is not writable)")
    return out


def prepare_out_dir(out: Path) -> Path:
    """Create the output folder (InputError if it cannot be)."""
    check_out_dir(out)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise InputError(f"--out {out}: cannot create directory ({_oserror_text(e)})") from None
    return out


def write_files(out: Path, writers: dict[str, Callable[[Path], None]], what: str) -> None:
    """Write every file of `writers` (name -> function writing that file) into `out` (created if needed),
    all or none, in the order given: each is complete under a temporary name before the first rename, and
    temporaries never outlive the call. An OSError becomes an InputError naming `what`."""
    prepare_out_dir(out)
    done: list[tuple[Path, Path]] = []
    try:
        try:
            for name, write in writers.items():
                tmp = _temp_in(out, name)
                done.append((tmp, out / name))
                write(tmp)
            for tmp, path in done:
                os.replace(tmp, path)
        except OSError as e:
            raise InputError(f"--out {out}: cannot write {what} ({_oserror_text(e)})") from None
    finally:
        for tmp, _ in done:
            tmp.unlink(missing_ok=True)


def write_run(out: Path, summary: dict[str, Any], requests: pd.DataFrame, iterations: pd.DataFrame) -> None:
    """Write requests.parquet, iterations.parquet and summary.json (renamed last) into `out`, all or none."""
    summary_text = json_text(summary)  # serialise first: a failure here must not touch the folder
    write_files(Path(out), {
        "requests.parquet": lambda p: requests.to_parquet(p, index=False),
        "iterations.parquet": lambda p: iterations.to_parquet(p, index=False),
        "summary.json": lambda p: p.write_text(summary_text, encoding="utf-8"),
    }, "the run's files")


def write_capacity(out: Path, spec: Any, results: dict[str, Any]) -> None:
    """capacity.json (the SLO and each policy's capacity), probes.csv (every probed run) and capacity.png."""
    from dataclasses import asdict

    import matplotlib.pyplot as plt

    from sim.plots import capacity_figure

    out.mkdir(parents=True, exist_ok=True)
    probes = pd.DataFrame([p for r in results.values() for p in r.probes])
    capacities = {name: r.qps for name, r in results.items()}
    atomic_write(out / "probes.csv", lambda p: probes.to_csv(p, index=False))
    fig = capacity_figure(probes, capacities, spec.slo)
    atomic_write(out / "capacity.png", lambda p: fig.savefig(p, dpi=110, format="png"))
    plt.close(fig)
    atomic_write(out / "capacity.json", lambda p: p.write_text(json_text(
        {"slo": asdict(spec.slo), "capacity_qps": capacities,
         "config": {k: v for k, v in asdict(spec.configs[0]).items() if k not in ("policy", "qps", "fast")}})))
