"""A helper for the research scripts' own tests (`python -m pytest research/tests`; not part of `make test`:
the product's tests never import research code)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType


def research_module(name: str) -> ModuleType:
    """The script research/NAME.py as a module (research/ is a folder of scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module
