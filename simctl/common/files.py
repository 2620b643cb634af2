"""A user's paths and input files: a path relative to the user's working folder, made absolute before any
child process starts; an input file's text, or one InputError saying why it cannot be had."""

from __future__ import annotations

import os
from pathlib import Path

from simctl.common.errors import InputError


def in_working_folder(path: str | os.PathLike[str]) -> str:
    """`path` made absolute against the working folder of the user who gave it, so that a child process (a
    real run, the profiler's timing child, a Ray worker in its own folder) finds the same file or folder."""
    return os.path.abspath(os.path.expanduser(os.fspath(path)))


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of `path`; InputError beginning with `what` (e.g. "sweep file x.toml") if it is missing
    or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: cannot read it ({e})") from None
