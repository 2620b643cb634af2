"""The saturation verdict: exact cases of each rule on constructed queues and rates, and simulated runs at a
very low and a very high rate."""

from __future__ import annotations

import numpy as np
import pytest

from results.saturation import BACKLOGGED, OVERLOADED, STABLE, served_rate, verdict
from sim.run import RunConfig, run


def test_rules_by_hand() -> None:
    flat = np.ones(40, dtype=np.int64)
    assert verdict(flat, 2.0, 2.0, None) == (STABLE, None)
    assert verdict(flat, 2.0, 2.0, "gave up")[0] == OVERLOADED  # unsustainable is always overloaded
    # growth: second quarter 2 on average, last quarter 5.1 > 1.5 x 2 + 2 (5 is not)
    grown = np.array([2] * 20 + [5] * 10 + [6] * 10)
    assert verdict(np.array([2] * 30 + [5] * 10), 1.0, 1.0, None) == (STABLE, None)
    assert verdict(grown, 1.0, 1.0, None)[0] == BACKLOGGED
    assert "grew" in verdict(grown, 1.0, 1.0, None)[1]
    # a standing queue of 9 (no trend): backlogged; of 8: not
    assert verdict(np.full(40, 9), 1.0, 1.0, None)[0] == BACKLOGGED
    assert verdict(np.full(40, 8), 1.0, 1.0, None) == (STABLE, None)
    # served under 80% of the offered rate
    assert verdict(flat, 2.0, 1.59, None) == (BACKLOGGED, "served 1.59 requests/s of 2 offered")
    assert verdict(flat, 2.0, 1.6, None) == (STABLE, None)
    assert verdict(flat, None, 1.0, None) == (STABLE, None)  # no rate offered (one arrival instant)
    # fewer than 16 arrivals show no trend
    assert verdict(np.array([1] * 8 + [50] * 7), 1.0, 1.0, None) == (STABLE, None)


def test_served_rate() -> None:
    assert served_rate(np.array([3.0, 1.0, 2.0, 5.0])) == 0.75
    assert served_rate(np.array([1.0])) is None
    assert served_rate(np.array([2.0, 2.0])) is None


@pytest.mark.parametrize(("qps", "want"), [(0.1, STABLE), (50.0, OVERLOADED)])
def test_simulated_runs(qps: float, want: str) -> None:
    s = run(RunConfig(policy="vllm", trace="sharegpt", num_requests=200, qps=qps)).summary
    assert s["saturation"] == want
    assert (s["saturation"] == OVERLOADED) == (not s["sustainable"])
    assert (s["saturation_reason"] is None) == (want == STABLE)
