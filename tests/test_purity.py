"""policies/ is pure decision logic: the simulator and the real engine drive the same objects."""

from __future__ import annotations

import ast
from pathlib import Path

FORBIDDEN = {"simpy", "torch", "transformers", "sim", "profiler", "time", "random"}


def _top(module: str) -> str:
    """A module's package: simctl's own by their name under the root ("simctl.sim.run" -> "sim")."""
    parts = module.split(".")
    return parts[1] if parts[0] == "simctl" and len(parts) > 1 else parts[0]


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(_top(a.name) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(_top(node.module))
    return names


def test_policies_import_no_engine_clock_or_randomness() -> None:
    files = sorted((Path(__file__).resolve().parents[1] / "simctl" / "policies").glob("*.py"))
    assert files
    for f in files:
        bad = _imports(f) & FORBIDDEN
        assert not bad, f"{f.name} imports {sorted(bad)}"


def test_simulator_does_not_import_torch() -> None:
    import subprocess
    import sys

    code = ("import sys, simctl.cli, simctl.sim.run, simctl.results.metrics; "
            "assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)
