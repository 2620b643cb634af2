"""research/host_noise.py: the machine's own speed per probe and window, from given samples."""

from __future__ import annotations

import numpy as np
import pytest
from research_scripts import research_module

noise = research_module("host_noise")


def test_windows_are_medians_over_the_run_median() -> None:
    # 0-9 s: product 1 ms, copy 2 ms; 10-19 s: product 1 ms, copy 3 ms (the memory got 1.5x slower)
    t = np.arange(20.0)
    rows = np.column_stack([t, np.full(20, 1e-3), np.where(t < 10, 2e-3, 3e-3)])
    s = noise.summary(rows, 10.0)
    assert s["compute"]["windows"] == pytest.approx([1.0, 1.0])
    assert s["memory"]["windows"] == pytest.approx([2 / 2.5, 3 / 2.5])  # the median of 2 and 3 ms is 2.5
    text = noise.markdown(s, 20, 20, 10)
    assert "| memory |" in text and "| 1.50 |" in text and "| 1.00 |" in text


def test_sampling_times_both_probes() -> None:
    rows = noise.sample(0.05)
    assert rows.shape[1] == 3 and len(rows) >= 1 and (rows[:, 1:] > 0).all()
