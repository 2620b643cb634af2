"""Reading a user's input file: its text, or one InputError saying why it cannot be had."""

from __future__ import annotations

from pathlib import Path

from common.errors import InputError


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of `path`; InputError beginning with `what` (e.g. "sweep file x.toml") if it is missing
    or unreadable."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InputError(f"{what}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"{what}: cannot read it ({e})") from None
