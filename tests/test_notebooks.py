"""The notebooks run top to bottom (their code cells, in order, in one namespace)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib
import pytest

pytestmark = pytest.mark.cli

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("*.ipynb"))


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_runs(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    matplotlib.use("Agg")
    monkeypatch.setenv("SIMCTL_NOTEBOOK_QUICK", "1")  # a notebook that reads it runs at a reduced size
    cells = json.loads(path.read_text())["cells"]
    code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
    assert code
    namespace: dict = {}
    for src in code:
        exec(compile(src, str(path), "exec"), namespace)  # noqa: S102 - the project's own notebook
    # compare_schedulers: every policy sustains some load
    if "caps" in namespace and isinstance(namespace["caps"], dict):
        assert all(v > 0 for v in namespace["caps"].values())
    if "comparison" in namespace:  # capacity_vs_slo: a capacity for every policy, trace and SLO
        assert (namespace["result"].table["capacity_qps"] > 0).all()
