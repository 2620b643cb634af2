"""The validation's stages over any engine (`simctl.validation.pipeline`), driven with a hand-built target
whose runs meet the SLO exactly up to a known rate (or, closed loop, concurrency): what is served in which
order, where the real capacity's bisection starts, and what each stage finds. No engine runs."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest

from simctl.common.errors import InputError
from simctl.studies.capacity import SLO
from simctl.traces.workload import Workload
from simctl.validation import pipeline
from simctl.validation.pipeline import Plan, Point, real_start
from simctl.validation.target import ServedRun

OPEN = Workload(trace="sharegpt", qps=None, num_requests=100)
CLOSED = Workload(trace="sharegpt", qps=None, num_requests=100, concurrency=4)

pytestmark = pytest.mark.unit


def _summary(qps: float, limit: float) -> dict[str, Any]:
    """A run that meets the default SLO (median scheduling delay <= 2 s) iff `qps` <= `limit`."""
    return {"sustainable": True, "completed": 100, "num_requests": 100,
            "sched_delay_p50": 1.0 if qps <= limit else 3.0}


def _value(w: Workload) -> float:
    """The load a run of `w` is at: its rate, or without one its closed-loop clients."""
    value = w.qps if w.qps is not None else w.concurrency
    assert value is not None
    return value


@dataclass
class Engine:
    """Its twin meets the SLO up to `twin_limit` QPS (or clients), its real runs up to `real_limit`; each
    real run's speed is 1 + its rank / 10."""

    twin_limit: float
    real_limit: float
    warm_up: bool = False
    served: list[tuple[str, float, Path | None]] = field(default_factory=list)
    workloads: list[Workload] = field(default_factory=list)  # each real run's

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def settings(self) -> dict[str, Any]:
        return {}

    def folder(self, policy: str) -> str:
        return policy

    def twin(self, policy: str, workload: Workload) -> dict[str, Any]:
        return _summary(_value(workload), self.twin_limit)

    def serve(self, policy: str, workload: Workload, out: Path | None) -> ServedRun:
        self.served.append((policy, _value(workload), out))
        self.workloads.append(workload)
        return ServedRun(_summary(_value(workload), self.real_limit), 1 + len(self.served) / 10)


def _plan(tmp_path: Path, **kw: Any) -> Plan:
    return Plan(**{"policies": ["a", "b"], "loads": [0.5, 0.9], "repeats": 2, "slo": SLO(),
                   "out": tmp_path / "v", "capacity": False, "workload": OPEN, "earlier": ("runs",),
                   **kw})


def test_rounds_serve_every_point_once_each_and_compare_each_point_after_them(tmp_path: Path) -> None:
    engine, compared = Engine(twin_limit=8.0, real_limit=100.0), []
    found = pipeline.run(engine, _plan(tmp_path), lambda p, runs: compared.append((p, runs)), print)
    for policy in ("a", "b"):
        assert 8.0 <= found.twin[policy].qps <= 8.0 * (1 + pipeline.SIM_REL_TOL)
    cap = found.twin["a"].qps
    order = [(p, q) for p, q, _ in engine.served]
    assert order == 2 * [("a", 0.5 * cap), ("a", 0.9 * cap), ("b", 0.5 * cap), ("b", 0.9 * cap)]
    assert engine.served[5][2] == tmp_path / "v" / "runs" / "a" / "load_0.9" / "real_2"
    assert [p for p, _ in compared] == [Point(p, x, cap, OPEN.at(x * cap)) for p in "ab" for x in (0.5, 0.9)]
    # each point's runs in round order; speeds in the order served
    assert [r.speed for r in compared[1][1]] == [1.2, 1.6]
    assert found.speeds() == pytest.approx([1 + k / 10 for k in range(1, 9)])
    assert found.real == {}


def test_an_engine_started_once_serves_a_discarded_run_at_the_last_load_first(tmp_path: Path) -> None:
    engine = Engine(twin_limit=8.0, real_limit=100.0, warm_up=True)
    found = pipeline.run(engine, _plan(tmp_path, policies=["a"], repeats=1), lambda p, r: None, print)
    assert engine.served[0] == ("a", 0.9 * found.twin["a"].qps, None)
    assert len(engine.served) == 3 and all(out is not None for _, _, out in engine.served[1:])


def test_the_real_capacity_starts_where_the_loads_left_it() -> None:
    slo, met, missed = SLO(), ServedRun(_summary(1, 2)), ServedRun(_summary(3, 2))
    at = {x: Point("a", x, 10.0, OPEN.at(10 * x)) for x in (0.5, 0.7, 0.9)}
    # every load met the SLO: from the twin's capacity
    assert real_start(10.0, {at[0.5]: [met], at[0.9]: [met, missed, met]}, slo) == 10.0
    # a load missed it by most repeats: from the highest load that met it
    assert real_start(10.0, {at[0.5]: [met], at[0.7]: [met], at[0.9]: [missed, missed, met]}, slo) == 7.0
    # every load missed it: one step below the lowest
    assert real_start(10.0, {at[0.5]: [missed], at[0.9]: [missed]}, slo) == 5.0 / pipeline.REAL_STEP


def test_the_real_capacity_is_bisected_to_one_tolerance(tmp_path: Path) -> None:
    engine = Engine(twin_limit=8.0, real_limit=6.0)
    plan = _plan(tmp_path, policies=["a"], loads=[0.5], repeats=1, capacity=True)
    found = pipeline.run(engine, plan, lambda p, r: None, print)
    real = found.real["a"]
    lo, hi = pipeline.bracket(real)
    assert lo <= 6.0 < hi  # the highest rate met, the lowest above it missed
    assert len(real.probes) <= pipeline.MAX_REAL_PROBES
    assert hi - lo <= pipeline.REAL_REL_TOL * lo or len(real.probes) == pipeline.MAX_REAL_PROBES
    probe_dirs = [out for _, _, out in engine.served[1:]]
    assert probe_dirs == [tmp_path / "v" / "capacity" / "a" / f"qps_{p['qps']:.5g}" for p in real.probes]


@pytest.mark.parametrize(("limit", "words"), [(1e-6, "no simulated rate meets the SLO"),
                                              (2e9, "is met at every simulated rate")])
def test_a_twin_capacity_that_does_not_exist_is_an_input_error_before_any_run(
        tmp_path: Path, limit: float, words: str) -> None:
    engine = Engine(twin_limit=limit, real_limit=1.0)
    with pytest.raises(InputError, match=words):
        pipeline.run(engine, _plan(tmp_path), lambda p, r: None, print)
    assert engine.served == [] and not (tmp_path / "v").exists()


@pytest.mark.parametrize(("loads", "words"), [([], "no load"), ([0.5, 0.5], "listed twice"),
                                              ([0], "in \\(0, 10\\]"), (["x"], "in \\(0, 10\\]")])
def test_bad_loads(loads: list[Any], words: str) -> None:
    with pytest.raises(InputError, match=words):
        pipeline.check_loads(loads)


def test_runs_at_the_fit_speed_are_those_within_its_tolerance() -> None:
    runs = [ServedRun({}, s) for s in (0.96, 1.04, 1.06, None, 0.94)]
    assert [r.speed for r in pipeline.at_fit_speed(runs)] == [0.96, 1.04]


def test_closed_loop_capacity_is_the_highest_concurrency_and_loads_are_rounded_client_counts(
        tmp_path: Path) -> None:
    """From the workload's 4 clients: 4 and 8 meet, 16 misses, then 12, 14, 13: the capacity is 13 clients;
    loads 0.3, 0.6, 0.9 of it are round(3.9, 7.8, 11.7) = 4, 8, 12 clients, served without a rate."""
    engine = Engine(twin_limit=13, real_limit=100)
    found = pipeline.run(engine, _plan(tmp_path, policies=["a"], loads=[0.3, 0.6, 0.9], repeats=1,
                                       workload=CLOSED), lambda p, r: None, print)
    twin = found.twin["a"]
    assert (twin.variable, twin.qps) == ("concurrency", 13)
    assert [p["concurrency"] for p in twin.probes] == [4, 8, 16, 12, 14, 13]
    assert [w.concurrency for w in engine.workloads] == [4, 8, 12]
    assert all(w.qps is None and w.num_requests == 100 for w in engine.workloads)
    assert [(p.load, p.variable, p.value) for p in found.runs] == [(0.3, "concurrency", 4),
                                                                  (0.6, "concurrency", 8),
                                                                  (0.9, "concurrency", 12)]


def test_closed_loop_loads_that_round_to_one_concurrency_are_served_once(tmp_path: Path) -> None:
    """Of 13 clients, loads 0.05 and 0.1 both round to 1 client (max(1, round(1.3))): the second is left
    out, and the progress says so; 0.4 is 5 clients."""
    engine, said = Engine(twin_limit=13, real_limit=100), []
    found = pipeline.run(engine, _plan(tmp_path, policies=["a"], loads=[0.05, 0.1, 0.4], repeats=1,
                                       workload=CLOSED), lambda p, r: None, said.append)
    assert [(p.load, p.value) for p in found.runs] == [(0.05, 1), (0.4, 5)]
    assert [w.concurrency for w in engine.workloads] == [1, 5]
    assert any("0.1 round to the concurrency of a lower load" in line and "served once" in line
               for line in said)


def test_closed_loop_real_capacity_is_bisected_to_one_client(tmp_path: Path) -> None:
    """Real runs meet the SLO up to 9 clients: of the loads' 4, 8 and 12 clients 12 missed, so the search
    starts at 8: 8 met, 16, 12 and 10 missed, 9 met."""
    engine = Engine(twin_limit=13, real_limit=9)
    plan = _plan(tmp_path, policies=["a"], loads=[0.3, 0.6, 0.9], repeats=1, capacity=True, workload=CLOSED)
    real = pipeline.run(engine, plan, lambda p, r: None, print).real["a"]
    assert (real.variable, real.qps, pipeline.bracket(real)) == ("concurrency", 9, (9, 10))
    assert [p["concurrency"] for p in real.probes] == [8, 16, 12, 10, 9]
    probe_dirs = [out for _, _, out in engine.served[3:]]
    assert probe_dirs == [tmp_path / "v" / "capacity" / "a" / f"concurrency_{n}" for n in (8, 16, 12, 10, 9)]


def test_a_closed_loop_twin_without_an_upper_bound_is_an_input_error_before_any_run(tmp_path: Path) -> None:
    """Every concurrency up to one client per request meets the SLO: no capacity, one line."""
    engine = Engine(twin_limit=1000, real_limit=1.0)
    with pytest.raises(InputError, match="every simulated concurrency up to 100 clients: 100 requests"):
        pipeline.run(engine, _plan(tmp_path, workload=CLOSED), lambda p, r: None, print)
    assert engine.served == [] and not (tmp_path / "v").exists()


@pytest.mark.parametrize(("workload", "variable"), [(OPEN, "qps"), (CLOSED, "concurrency"),
                                                    (CLOSED.at(2.0), "qps")])
def test_with_a_rate_the_loads_scale_the_rate_even_with_closed_loop_clients(workload: Workload,
                                                                           variable: str) -> None:
    assert pipeline.variable_of(workload) == variable
