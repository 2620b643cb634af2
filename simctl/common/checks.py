"""Type checks of option values, shared by every command that validates its options."""

from __future__ import annotations

import sys


def _numpy_types(name: str) -> tuple[type, ...]:
    """numpy's scalar type `name` when numpy is loaded, else none: a numpy value cannot exist before numpy is
    imported, so the check need not import it (option parsing stays free of numerical libraries)."""
    np = sys.modules.get("numpy")
    return (getattr(np, name),) if np is not None else ()


def is_int(v: object) -> bool:
    return isinstance(v, (int, *_numpy_types("integer"))) and not isinstance(v, bool)


def is_number(v: object) -> bool:
    return isinstance(v, (int, float, *_numpy_types("integer"), *_numpy_types("floating"))) \
        and not isinstance(v, bool)
