"""research/vllm_step_gaps.py: the gap from a step's end to the next one's start, per run (no vLLM needed)."""

from __future__ import annotations

import pandas as pd
import pytest
from research_scripts import research_module

gaps = research_module("vllm_step_gaps")


def test_gaps_are_taken_within_each_run_in_start_order(tmp_path) -> None:
    # run 1: steps at 0-2 ms, 2.5-4.5 ms, 10-11 ms (written out of order); run 2: one step (no gap after it)
    one = tmp_path / "v" / "runs" / "load_0.5" / "real"
    two = tmp_path / "v" / "runs" / "load_0.5" / "real_2"
    for d in (one, two):
        d.mkdir(parents=True)
    pd.DataFrame({"start_s": [0.0025, 0.0, 0.010], "duration_s": [0.002, 0.002, 0.001],
                  "batch_size": [3, 2, 5], "prefill_tokens": [0, 0, 40]}
                 ).to_parquet(one / "iterations.parquet")
    pd.DataFrame({"start_s": [1.0], "duration_s": [0.003], "batch_size": [2],
                  "prefill_tokens": [0]}).to_parquet(two / "iterations.parquet")
    steps = gaps.steps([tmp_path / "v"], "0.5")
    assert steps["batch_size"].tolist() == [2, 3]  # each run's last step has no gap after it
    assert steps["gap_after_s"].tolist() == pytest.approx([0.0005, 0.0055])
    text = gaps.table([tmp_path / "v"], ["0.5"])
    assert "| 0.5 | 1-4 | 2 | 2.00 | 1 | 0.500 |" in text  # the 5.5 ms gap is not consecutive
