"""The saturation verdict: exact cases of each rule on constructed queues and rates, simulated runs at a very
low and a very high rate, and an offline batch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simctl.results.saturation import (
    BACKLOGGED,
    OFFLINE,
    OVERLOADED,
    STABLE,
    TOO_SHORT,
    served_rate,
    too_short,
    verdict,
)
from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload


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


def test_too_short_to_judge() -> None:
    arrivals = np.arange(50) / 2.0  # 50 requests over 24.5 s
    assert too_short(arrivals, np.full(50, 6.0)) is None  # 24.5 s >= 4 x 6 s
    assert "4x the P99 service time" in too_short(arrivals, np.full(50, 6.2))
    assert "under the 16" in too_short(arrivals[:15], np.full(15, 0.1))
    flat = np.ones(50, dtype=np.int64)
    short = too_short(arrivals, np.full(50, 20.0))
    # a served-rate shortfall of a short run is no backlog; an observed queue still is, and overload wins
    assert verdict(flat, 2.0, 1.25, None, short) == (TOO_SHORT,
                                                     f"served 1.25 requests/s of 2 offered, but {short}")
    assert verdict(flat, 2.0, 2.0, None, short) == (STABLE, None)  # nothing wrong seen: stable
    assert verdict(np.full(50, 9), 2.0, 1.25, None, short)[0] == BACKLOGGED
    assert verdict(flat, 2.0, 0.5, "gave up", short)[0] == OVERLOADED


def test_short_run_with_a_long_tail() -> None:
    """The issue's case: 50 ShareGPT requests at 2 QPS, served at under 80% of the offered rate only because
    the last ones are long, with a queue never above 2, were called backlogged."""
    s = run(RunConfig(policy="vllm", workload=Workload(trace="sharegpt", num_requests=50, qps=2.0,
                                                       seed=2))).summary
    assert s["saturation"] == TOO_SHORT
    assert "P99 service time" in s["saturation_reason"]


def test_served_rate() -> None:
    assert served_rate(np.array([3.0, 1.0, 2.0, 5.0])) == 0.75
    assert served_rate(np.array([1.0])) is None
    assert served_rate(np.array([2.0, 2.0])) is None


@pytest.mark.parametrize(("qps", "want"), [(0.1, STABLE), (50.0, OVERLOADED)])
def test_simulated_runs(qps: float, want: str) -> None:
    s = run(RunConfig(policy="vllm", workload=Workload(trace="sharegpt", num_requests=200, qps=qps))).summary
    assert s["saturation"] == want
    assert (s["saturation"] == OVERLOADED) == (not s["sustainable"])
    assert (s["saturation_reason"] is None) == (want == STABLE)


def test_an_offline_batch_is_served_whole_and_judged_as_one(tmp_path: Path) -> None:
    # 200 requests there at t = 0, far past the waiting queue an open-loop run gives up at (100): a throughput
    # benchmark's workload, served to its last request; the same requests arriving at 50 QPS overload
    trace = tmp_path / "offline.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n" + "300,20,0\n" * 200)
    s = run(RunConfig(policy="vllm", workload=Workload(trace=str(trace), qps=None, num_requests=200))).summary
    assert s["completed"] == 200 and not s["gave_up"] and s["makespan_s"] > 0
    assert s["saturation"] == OFFLINE and s["sustainable"] and s["offered_qps"] is None
    lengths = tmp_path / "lengths.csv"
    lengths.write_text("num_prefill_tokens,num_decode_tokens\n" + "300,20\n" * 200)
    paced = run(RunConfig(policy="vllm", workload=Workload(trace=str(lengths), qps=50.0, num_requests=200)))
    assert paced.summary["saturation"] == OVERLOADED
