"""A package's names loaded on first use (PEP 562), so that importing one of its light modules does not import
the heavy ones its `__init__` re-exports (the command line's option parsing must not load numpy, scipy or
pandas)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def lazy_exports(package: str, homes: dict[str, str]) -> Callable[[str], Any]:
    """The module `__getattr__` of `package` that finds each name of `homes` (name -> submodule) when first
    asked for."""

    def __getattr__(name: str) -> Any:
        if name not in homes:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{homes[name]}"), name)

    return __getattr__
