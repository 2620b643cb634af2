"""The validation's stages over any engine (a `validation.target.Target`), with one set of constants.

1. **Twin capacity**: per policy, the highest rate whose *simulated* run meets the SLO, bisected to
   `SIM_REL_TOL` in at most `SIM_MAX_PROBES` probes (cheap: milliseconds a probe).
2. **Loads**: in each of `repeats` rounds every (policy, load) is served for real once, so a slow spell of
   a shared machine lands on one repeat of several points rather than on every repeat of one (on this
   project's 2-core VM the same run's decode steps took 2.1 ms in one run and 3.0 ms a minute later). An
   engine started once (`Target.warm_up`) first serves a discarded run at the last load.
3. **Comparison**: each point's repeats against its twin, raw and at the machine's speed during the runs,
   is the front end's (`ComparePoint`): simctl's engine replays its iterations (`validation.compare`), vLLM's
   reads its steps back (`validation.vllm_validate`); `at_fit_speed` picks the runs made at the fit's speed.
4. **Real capacity** (optional): the SLO bisected over real runs with at most `MAX_REAL_PROBES`, bracketing
   by factors of `REAL_STEP` from the twin's capacity, or, if a point's runs already missed the SLO (by most
   repeats), from the highest load rate that met it (the real capacity is above it and below the miss).

With closed-loop clients and no rate (`Workload.concurrency` without `qps`) the rate has no bound: the
variable is the concurrency instead (`studies.capacity.search_concurrency`, as `simctl capacity
--concurrency`): each capacity is a number of clients, each load `max(1, round(load x twin capacity))`
clients (loads that round to the same number are served once), and the real capacity is bisected to one
client.

Files in `out`: `runs/<folder>/load_<x>/real`, `real_2`, ... and `capacity/<folder>/qps_<q>/` (closed loop:
`concurrency_<n>/`; `Target.folder`: the policy for simctl's engine, nothing for vLLM's)."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from simctl.common.errors import InputError
from simctl.results.validation_report import fmt_err, pct_error
from simctl.studies.capacity import SLO, CapacityResult, search_concurrency, search_qps
from simctl.traces.workload import Workload
from simctl.validation.target import ServedRun, Target

SIM_REL_TOL = 0.01
SIM_MAX_PROBES = 40
REAL_REL_TOL = 0.03
REAL_STEP = 1.25
MAX_REAL_PROBES = 6
MAX_LOAD = 10.0
MAX_REPEATS = 20
FIT_SPEED_TOL = 0.05  # a run at the fit's speed: its speed factor within 5% of 1


def variable_of(workload: Workload) -> str:
    """What a validation of `workload` varies: "qps", or with closed-loop clients and no rate, "concurrency"
    (with both, the loads scale the rate, as vLLM bench's --request-rate with --max-concurrency)."""
    return "concurrency" if workload.concurrency is not None and workload.qps is None else "qps"


def at_value(workload: Workload, variable: str, value: float) -> Workload:
    """`workload` at `value` of `variable`: a rate, or a number of closed-loop clients."""
    return workload.at_concurrency(int(value)) if variable == "concurrency" else workload.at(value)


def value_of(workload: Workload) -> float:
    """`workload`'s value of the variable a validation of it varies (`variable_of`)."""
    value = workload.concurrency if variable_of(workload) == "concurrency" else workload.qps
    assert value is not None, "a load's workload has its rate or its concurrency"
    return value


def describe(variable: str, value: float) -> str:
    return f"{value:g} clients" if variable == "concurrency" else f"{value:.4g} QPS"


@dataclass(frozen=True)
class Point:
    """A policy served at a load: a fraction of its twin capacity, `value` (the rate of its `workload`, or
    with closed-loop clients its concurrency)."""

    policy: str
    load: float
    capacity: float  # the policy's twin capacity, in the same variable
    workload: Workload  # the workload each run of the point serves

    @property
    def variable(self) -> str:
        return variable_of(self.workload)

    @property
    def value(self) -> float:
        return value_of(self.workload)


def points_of(policy: str, loads: list[float], capacity: float, workload: Workload
              ) -> tuple[list[Point], list[float]]:
    """`policy`'s points at `loads` of its twin `capacity` on `workload`, and the loads left out: with
    closed-loop clients a load is `max(1, round(load x capacity))` clients, and one that rounds to the
    concurrency of an earlier load would serve the same runs again."""
    variable = variable_of(workload)
    points: dict[float, Point] = {}
    left_out = []
    for x in loads:
        value = max(1, round(x * capacity)) if variable == "concurrency" else x * capacity
        if value in points:
            left_out.append(x)
        else:
            points[value] = Point(policy, x, capacity, at_value(workload, variable, value))
    return list(points.values()), left_out


class ComparePoint(Protocol):
    def __call__(self, point: Point, runs: list[ServedRun]) -> None:
        """Step 3: a point's real runs (its repeats, in order) against its twin."""


@dataclass
class Outcome:
    """What the stages found: each policy's twin capacity, each point's real runs (in round order), and each
    policy's real capacity (when asked)."""

    twin: dict[str, CapacityResult] = field(default_factory=dict)
    runs: dict[Point, list[ServedRun]] = field(default_factory=dict)
    real: dict[str, CapacityResult] = field(default_factory=dict)

    def speeds(self) -> list[float | None]:
        """Each real run's speed factor, in the order the runs were served."""
        rounds = max((len(r) for r in self.runs.values()), default=0)
        return [runs[k].speed for k in range(rounds) for runs in self.runs.values()]


def check_loads(loads: Any) -> list[float]:
    """The loads as floats; InputError unless distinct numbers in (0, MAX_LOAD]."""
    from simctl.common.checks import is_number

    loads = [loads] if isinstance(loads, (int, float)) else list(loads)
    if not loads:
        raise InputError("no load given (fractions of the simulated capacity, e.g. 0.5,0.7)")
    for v in loads:
        if not is_number(v) or not (0 < v <= MAX_LOAD and math.isfinite(v)):
            raise InputError(f"--loads: each load must be a number in (0, {MAX_LOAD:g}] (a fraction of the "
                             f"simulated capacity), got {v!r}")
    if len(set(loads)) != len(loads):
        raise InputError(f"a load is listed twice: {', '.join(f'{v:g}' for v in loads)}")
    return [float(v) for v in loads]


def check_repeats(repeats: Any) -> None:
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise InputError(f"--repeats must be an integer from 1 to {MAX_REPEATS}, got {repeats!r}")


def bracket(result: CapacityResult) -> tuple[float, float | None]:
    """(highest value that met the SLO, lowest value above it that did not; None if none was probed)."""
    var = result.variable
    above = [p[var] for p in result.probes if not p["slo_met"] and p[var] > result.qps]
    return result.qps, (min(above) if above else None)


def search(probe: Callable[[Workload], dict[str, Any]], workload: Workload, slo: SLO, start: float,
           rel_tol: float, max_probes: int, step: float = 2.0) -> CapacityResult:
    """The highest rate (or, closed loop, concurrency up to one client per request) of `workload` whose
    `probe` meets `slo`, from `start`."""
    if variable_of(workload) == "concurrency":
        return search_concurrency(lambda n: probe(workload.at_concurrency(n)), slo, max(1, round(start)),
                                  workload.num_requests, max_probes)
    return search_qps(lambda q: probe(workload.at(q)), slo, start, rel_tol, max_probes, step)


def twin_capacity(target: Target, policy: str, slo: SLO, workload: Workload) -> CapacityResult:
    """1. `policy`'s twin capacity under `slo` (probes are `target.twin`'s runs); closed loop, from the
    workload's own concurrency."""
    start = value_of(workload) if variable_of(workload) == "concurrency" else 1.0
    return search(lambda w: target.twin(policy, w), workload, slo, start, SIM_REL_TOL, SIM_MAX_PROBES)


def checked_twin_capacity(target: Target, policy: str, slo: SLO, workload: Workload) -> CapacityResult:
    """`twin_capacity`; InputError unless one value met the SLO and a higher one missed it."""
    found = twin_capacity(target, policy, slo, workload)
    lo, hi = bracket(found)
    what = "concurrency" if found.variable == "concurrency" else "rate"
    if lo <= 0:
        raise InputError(f"{policy}: no simulated {what} meets the SLO ({slo.describe()}); relax it")
    if hi is None:
        raise InputError(f"{policy}: the SLO ({slo.describe()}) is met at every simulated {what} up to "
                         f"{f'{lo:.3g} QPS' if what == 'rate' else describe(found.variable, lo)}: "
                         f"{workload.num_requests} requests are served "
                         "before a queue builds; raise --num-requests (or tighten the SLO)")
    return found


def at_fit_speed(runs: list[ServedRun]) -> list[ServedRun]:
    """The runs made at the speed the cost model was fitted at (within `FIT_SPEED_TOL`): they compare with the
    raw twin without scaling (near saturation a twin scaled by a run's factor extrapolates from prices a few
    percent off, where 5% of cost moves the P50s by 15-25 points)."""
    return [r for r in runs if r.speed is not None and abs(r.speed - 1) <= FIT_SPEED_TOL]


def real_dirs(run_dir: Path, repeats: int) -> list[Path]:
    """Where the real runs of one policy and load go: `real/`, then `real_2/`, `real_3/`, ..."""
    return [run_dir / "real"] + [run_dir / f"real_{k}" for k in range(2, repeats + 1)]


def remove_earlier(out: Path, say: Callable[[str], None], names: tuple[str, ...]) -> None:
    """Remove an earlier validation's `names` from `out` (check_out_dir let nothing else be there): a
    validation writes its runs as it goes, and another's runs left beside them would pass for this one's."""
    earlier = [out / name for name in names if (out / name).exists()]
    if earlier:
        say(f"replacing the earlier {', '.join(p.name for p in earlier)} in {out}")
    for p in earlier:
        if p.is_dir():
            shutil.rmtree(p)
        else:
            p.unlink()


def run_dir(out: Path, target: Target, point: Point) -> Path:
    return out / "runs" / target.folder(point.policy) / f"load_{point.load:g}"


def serve_rounds(target: Target, points: list[Point], repeats: int, out: Path,
                 say: Callable[[str], None]) -> dict[Point, list[ServedRun]]:
    """2. `repeats` rounds of real runs of every point (after a discarded one, for an engine started once)."""
    if target.warm_up and points:
        target.serve(points[-1].policy, points[-1].workload, None)
    runs: dict[Point, list[ServedRun]] = {p: [] for p in points}
    for k in range(repeats):
        for p in points:
            say(f"{p.policy}: real run at load {p.load:g} ({describe(p.variable, p.value)}, "
                f"{p.workload.num_requests} requests)"
                + (f", repeat {k + 1} of {repeats}" if repeats > 1 else ""))
            runs[p].append(target.serve(p.policy, p.workload, real_dirs(run_dir(out, target, p), repeats)[k]))
    return runs


def real_start(sim_capacity: float, runs: dict[Point, list[ServedRun]], slo: SLO) -> float:
    """Where the real capacity's bisection starts: the twin's capacity, unless a point's runs missed the SLO
    (by most repeats): then the highest load value that met it (or the lowest one, one step down)."""
    met = {p.value: 2 * sum(slo.met(r.summary) for r in served) > len(served) for p, served in runs.items()}
    if all(met.values()):
        return sim_capacity
    ok = [q for q, m in met.items() if m]
    return max(ok) if ok else min(met) / REAL_STEP


def real_capacity(target: Target, policy: str, slo: SLO, start: float, workload: Workload, out: Path,
                  say: Callable[[str], None]) -> CapacityResult:
    """4. `policy`'s real capacity under `slo`, from `start`."""
    variable = variable_of(workload)

    def probe(w: Workload) -> dict[str, Any]:
        value = value_of(w)
        folder = f"concurrency_{value}" if variable == "concurrency" else f"qps_{value:.5g}"
        served = target.serve(policy, w, out / "capacity" / target.folder(policy) / folder)
        s = {**served.summary, "foreign_cpu_share": served.foreign_share}
        foreign = served.foreign_share
        say(f"{policy}: real capacity probe at {describe(variable, value)}: SLO "
            f"{'met' if slo.met(s) else 'missed'} (median scheduling delay {s['sched_delay_p50']:.3g} s, "
            f"other CPU {'n/a' if foreign is None else f'{foreign:.0%}'})")
        return s

    return search(probe, workload, slo, start, REAL_REL_TOL, MAX_REAL_PROBES, REAL_STEP)


@dataclass(frozen=True)
class Plan:
    """What the stages run: the policies, the loads, the rounds, the SLO and where the files go (`earlier`:
    the report's files, an earlier validation's of which are removed before the first run)."""

    policies: list[str]
    loads: list[float]
    repeats: int
    slo: SLO
    out: Path
    capacity: bool
    workload: Workload  # every run's requests; the rate (or, closed loop, the concurrency) is each load's
    earlier: tuple[str, ...]


def run(target: Target, plan: Plan, compare: ComparePoint, say: Callable[[str], None]) -> Outcome:
    """The stages on a started `target`; `compare` is called on each point once every round ran."""
    from simctl.results.output import prepare_out_dir

    found, var = Outcome(), variable_of(plan.workload)
    for policy in plan.policies:  # all before any real run: an SLO that does not bind fails fast
        found.twin[policy] = checked_twin_capacity(target, policy, plan.slo, plan.workload)
        say(f"{policy}: simulated capacity {describe(var, found.twin[policy].qps)} "
            f"({len(found.twin[policy].probes)} simulated probes)")
    remove_earlier(prepare_out_dir(plan.out), say, plan.earlier)
    points = []
    for policy in plan.policies:
        mine, left_out = points_of(policy, plan.loads, found.twin[policy].qps, plan.workload)
        points += mine
        if left_out:
            say(f"{policy}: load(s) {', '.join(f'{x:g}' for x in left_out)} round to the concurrency of a "
                f"lower load ({', '.join(describe(var, p.value) for p in mine)}): served once")
    found.runs = serve_rounds(target, points, plan.repeats, plan.out, say)
    for p in points:
        compare(p, found.runs[p])
    for policy in plan.policies if plan.capacity else ():
        sim = found.twin[policy].qps
        start = real_start(sim, {p: r for p, r in found.runs.items() if p.policy == policy}, plan.slo)
        real = found.real[policy] = real_capacity(target, policy, plan.slo, start, plan.workload, plan.out,
                                                  say)
        rlo, rhi = bracket(real)
        say(f"{policy}: real capacity {describe(var, rlo)} (first failing "
            f"{rhi if rhi is None else f'{rhi:.4g}'}), "
            f"capacity error {fmt_err(pct_error(sim, rlo) if rlo > 0 else None)}")
    return found
