"""Write a run's outputs so that nothing is ever half-written: each file goes to a temporary name in the
target folder and is renamed into place only once complete.

`write_run` writes all its files to temporary names first and renames them only when every one of them is
complete (summary.json last, so its presence marks a finished run): a run that fails, or is interrupted,
leaves the folder as it was, including any files of an earlier run.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simctl.common.errors import InputError
from simctl.common.files import in_working_folder

if TYPE_CHECKING:
    import pandas as pd


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


# a deployment's run, simulated or real (`write_cluster_files`); summary.json renamed last
CLUSTER_RUN_FILES = ("requests.parquet", "iterations.parquet", "replicas.parquet", "summary.json")
TIMELINE_FILE = "timeline.parquet"  # `simctl run --timeline N`: the first N iterations' members


def _is_temp(name: str) -> bool:
    """A temporary of `_temp_in`, left by a process that was killed before it could remove it."""
    return name.startswith(".") and name.endswith(".tmp")


def check_out_dir(out: Path, files: tuple[str, ...] = (), dirs: tuple[str, ...] = ()) -> Path:
    """Check, without creating anything, that `out` is (or can be made) a writable folder; raise InputError
    if not. Called before the run so that a bad path fails fast and a failed run leaves no trace. With
    `files` and `dirs` (the files and folders the command writes there), `out` must hold nothing else, so
    that two commands' results never mix in one folder, and none of `files` may be a directory. Returns `out`
    made absolute in the working folder, the path to hand a child process."""
    out = Path(out)
    if out.exists():
        if not out.is_dir():
            raise InputError(f"--out {out}: exists and is not a directory")
        if not os.access(out, os.W_OK | os.X_OK):
            raise InputError(f"--out {out}: directory is not writable")
        if files:
            ours = (*files, *(f"{d}/" for d in dirs))
            others = sorted(e.name for e in out.iterdir()
                            if e.name not in files and not (e.name in dirs and e.is_dir())
                            and not _is_temp(e.name))
            if others:
                shown = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
                raise InputError(f"--out {out}: holds other files ({shown}); give a new or empty folder, or "
                                 f"one that holds only an earlier {', '.join(ours)}")
            for name in files:
                if (out / name).is_dir():
                    raise InputError(f"--out {out}: {name} is a directory")
        return Path(in_working_folder(out))
    parent = out.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise InputError(f"--out {out}: cannot create directory ({parent} is not a directory)")
    try:  # os.access cannot tell (root passes it in /proc): make and remove a folder there
        os.rmdir(tempfile.mkdtemp(prefix=".simctl-", dir=parent))
    except OSError as e:
        raise InputError(f"--out {out}: cannot create directory in {parent} ({_oserror_text(e)})") from None
    return Path(in_working_folder(out))


def check_out_file(path: Path, option: str, what: str, ours: Callable[[Path], bool],
                   inputs: dict[str, str | os.PathLike[str] | None] | None = None) -> Path:
    """--out's rule for an option that writes one file (`option`, e.g. "--trace-events"): the file may be
    new or an earlier one of the same kind (`ours(path)`: `what`, e.g. "trace-events file"), which is
    replaced, and never one of the command's `inputs` (option -> path given); InputError before any work
    otherwise. Returns the path made absolute in the working folder."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{option} {path}: is a folder; give a file name")
    for name, given in (inputs or {}).items():  # a name that is no file (a trace profile) is no input file
        if given is not None and path.exists() and Path(given).exists() and os.path.samefile(given, path):
            raise InputError(f"{option} {path}: is the input of {name}; give another file name")
    if path.exists() and not ours(path):
        raise InputError(f"{option} {path}: exists and is not an earlier {what}; give a new file name, or "
                         "remove it")
    check_out_dir(path.parent)
    return Path(in_working_folder(path))


def file_ends(path: Path, size: int = 4096) -> tuple[bytes, bytes]:
    """The first and last `size` bytes of `path` (b"", b"" if it cannot be read): enough to recognise a file
    a command wrote, without reading it whole."""
    try:
        with open(path, "rb") as f:
            head = f.read(size)
            f.seek(max(0, os.fstat(f.fileno()).st_size - size))
            return head, f.read(size)
    except OSError:
        return b"", b""


def earlier_outputs(out: Path, files: tuple[str, ...]) -> list[str]:
    """Which of `files` an earlier command left in `out` (they will be replaced)."""
    return [name for name in files if (Path(out) / name).exists()]


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
    temporaries never outlive the call, nor do the folders it created when it fails or is interrupted. An
    OSError becomes an InputError naming `what`."""
    out = Path(out)
    created = [d for d in (out, *out.parents) if not d.exists()]  # deepest first
    prepare_out_dir(out)
    done: list[tuple[Path, Path]] = []
    try:
        for name in writers:  # a rename onto a folder would fail half-way through
            if (out / name).is_dir():
                raise InputError(f"--out {out}: {name} is a directory")
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
    except BaseException:
        for d in created:  # --out is left as it was: a folder that did not exist goes again
            try:
                d.rmdir()
            except OSError:  # no longer empty: someone else writes there too
                break
        raise


def write_run(out: Path, summary: dict[str, Any], requests: pd.DataFrame, iterations: pd.DataFrame,
              timeline: pd.DataFrame | None = None, replicas: pd.DataFrame | None = None) -> None:
    """Write requests.parquet, iterations.parquet, replicas.parquet (a deployment's) and timeline.parquet when
    given, and summary.json (renamed last) into `out`, all or none; an earlier run's timeline.parquet goes
    when this run recorded none."""
    summary_text = json_text(summary)  # serialise first: a failure here must not touch the folder
    frames = {"requests.parquet": requests, "iterations.parquet": iterations, "replicas.parquet": replicas,
              TIMELINE_FILE: timeline}
    write_files(Path(out), {
        **{name: _parquet(frame) for name, frame in frames.items() if frame is not None},
        "summary.json": lambda p: p.write_text(summary_text, encoding="utf-8"),
    }, "the run's files")
    if timeline is None:
        (Path(out) / TIMELINE_FILE).unlink(missing_ok=True)


def write_cluster_files(out: Path, summary: dict[str, Any], requests: pd.DataFrame, iterations: pd.DataFrame,
                        replicas: pd.DataFrame, timeline: pd.DataFrame | None = None) -> None:
    """A deployment's run files into `out` (a simulated or a real one): `write_run`'s and replicas.parquet."""
    write_run(out, summary, requests, iterations, timeline, replicas=replicas)


def _parquet(frame: pd.DataFrame) -> Callable[[Path], None]:
    return lambda path: frame.to_parquet(path, index=False)
