"""research/vllm_step_shapes.py: a run's steps in one line, a twin's stretch rows expanded (no vLLM)."""

from __future__ import annotations

import pandas as pd
from research_scripts import research_module

shapes = research_module("vllm_step_shapes")


def test_a_stretch_row_counts_as_its_iterations_each_its_share_of_the_time() -> None:
    # a prefill of 100 tokens (0-4 ms), then a stretch of 3 decodes of 2 rows (4-10 ms: 2 ms each), then one
    # decode of 1 row (10-11 ms): 5 steps ending at 4, 6, 8, 10, 11 ms, periods 2, 2, 2, 1 ms
    it = pd.DataFrame({"start_s": [0.0, 0.004, 0.010], "duration_s": [0.004, 0.006, 0.001],
                       "count": [1, 3, 1], "prefill_tokens": [100, 0, 0], "decode_tokens": [0, 2, 1]})
    requests = pd.DataFrame({"max_tbt_s": [0.002, 0.003], "preemptions": [0, 1]})
    line = shapes.describe("twin x1", it, requests)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[:3] == ["twin x1", "5", "1.4 / 2"]  # decode rows (0 + 2 + 2 + 2 + 1) / 5
    assert cells[3].startswith("20 / ") and cells[3].endswith(" / 100")  # prefill tokens per step
    assert cells[4].startswith("2.0 / ")  # median period 2 ms
    assert cells[6] == "1"
