"""The simulator's outputs are bit-identical to those recorded in tests/golden/runs.json (see record.py
there): restructuring the core must not move a single result. Re-record only for an intended change of
behaviour."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent / "golden"))
import record

RECORDED = json.loads(record.RUNS_PATH.read_text(encoding="utf-8"))


def test_every_case_recorded() -> None:
    assert sorted(RECORDED) == sorted(record.key(c) for c in record.cases())


@pytest.mark.parametrize("case", record.cases(), ids=record.key)
def test_bit_identical(case: dict) -> None:
    want = RECORDED[record.key(case)]
    got = record.record(case)
    assert got["summary"] == want["summary"]
    for table in ("requests", "iterations"):
        moved = sorted(c for c in want[table] if got[table].get(c) != want[table][c])
        assert not moved and got[table].keys() == want[table].keys(), f"{table}: columns moved: {moved}"
