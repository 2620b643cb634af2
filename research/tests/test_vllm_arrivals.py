"""research/vllm_arrivals.py: a served step's arrivals split at its launch (no vLLM needed)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from research_scripts import research_module

from simctl.traces.request import Request

arrivals = research_module("vllm_arrivals")


def test_arrivals_split_into_the_gap_and_the_execution() -> None:
    # steps end at 1, 3, 6 ms; the model ran the last 1 ms of each (starts 0, 2, 5 ms)
    frame = pd.DataFrame({"start_s": [0.0, 0.002, 0.005], "duration_s": [0.001, 0.001, 0.001],
                          "prefill_tokens": [10, 11, 12], "decode_tokens": [0, 1, 2]})
    # request 1 arrives in step 1's gap (1.5 ms), request 2 during its execution (2.5 ms), none in step 2
    requests = [Request(0, 0.0, 10, 5), Request(1, 0.0015, 11, 5), Request(2, 0.0025, 12, 5)]
    members = [[(0, 0)], [(1, 0), (0, 1)], [(2, 0), (0, 2), (1, 1)]]
    run = SimpleNamespace(result=SimpleNamespace(iterations=SimpleNamespace(frame=lambda: frame)),
                          members=members, requests=requests)
    rows = arrivals.step_rows(run, {r.id: r.prompt_tokens for r in requests})
    assert [(r["arrival_gap"], r["arrival_exec"], r["step"].arrivals) for r in rows] == [(1, 1, 2), (0, 0, 0)]
    assert [r["exec_s"] for r in rows] == pytest.approx([0.001, 0.001])
    assert [r["step"].period_s for r in rows] == pytest.approx([0.002, 0.003])
    assert rows[1]["step"].prefills == (12,) and rows[1]["step"].decode_contexts == (11, 11)


def test_regress_recovers_a_known_split() -> None:
    rng = np.random.default_rng(0)
    x = np.column_stack([np.ones(200), rng.integers(0, 4, 200), rng.integers(0, 4, 200)])
    y = x @ np.array([1e-3, 2e-4, 5e-4])
    assert arrivals.regress(x, y) == pytest.approx([1e-3, 2e-4, 5e-4], abs=1e-7)
