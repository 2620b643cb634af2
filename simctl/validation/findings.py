"""What a validation of simctl's engine keeps of the stages (`validation.pipeline`): each point's real runs
against their twin (`validation.compare`) as a report row, its per-iteration evidence and CDF data, and each
policy's capacities as the report records them."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simctl.costs.base import CostModel
from simctl.results.validation_report import RunPair, fmt_err, fmt_ratio, pct_error, unavailable
from simctl.studies.capacity import SLO, CapacityResult
from simctl.validation.compare import compare_run
from simctl.validation.pipeline import Outcome, Point, bracket, real_dirs, run_dir
from simctl.validation.target import ServedRun, Target

# a capacity probe's keys that validation.json keeps, after the value probed (`probe_keys`)
SIM_PROBE_KEYS = ("slo_met", "sched_delay_p50", "tbt_p99", "ttft_p50", "sustainable", "completed",
                  "throughput_rps")


@dataclass
class Findings:
    """Each validation point's report row, per-iteration evidence and CDF data."""

    rows: list[dict[str, Any]] = field(default_factory=list)
    evidence: list[dict[str, Any]] = field(default_factory=list)
    pairs: list[RunPair] = field(default_factory=list)

    def add(self, found: tuple[dict[str, Any], dict[str, Any], RunPair]
            ) -> tuple[dict[str, Any], dict[str, Any]]:
        row, ev, pair = found
        self.rows.append(row)
        self.evidence.append(ev)
        self.pairs.append(pair)
        return row, ev


@dataclass
class Comparisons:
    """Step 3 of simctl's engine: each point's real runs (read back from their folders) against their twin,
    priced by `fitted`."""

    target: Target
    fitted: CostModel
    slo: SLO
    out: Path
    repeats: int
    say: Callable[[str], None]
    found: Findings = field(default_factory=Findings)

    def __call__(self, point: Point, runs: list[ServedRun]) -> None:
        shares = [r.foreign_share for r in runs if r.foreign_share is not None]
        where = run_dir(self.out, self.target, point)
        row, ev = self.found.add(compare_run(point.policy, point.load, point.value, point.capacity,
                                             real_dirs(where, self.repeats), where, self.fitted, self.slo,
                                             max(shares) if shares else None, point.variable))
        self.say(f"{point.policy} @ {point.load:g}: P50 TTFT {fmt_err(row['ttft_p50_err_pct'])}, P50 TBT "
                 f"{fmt_err(row['tbt_p50_err_pct'])}, P50 E2E {fmt_err(row['e2e_p50_err_pct'])}; busy "
                 f"real/repriced {fmt_ratio(ev['busy_ratio_real_over_repriced'])}"
                 + (f" (n/a: {why})" if (why := unavailable(row)) else ""))


def probe_keys(variable: str) -> tuple[str, ...]:
    """The keys of a capacity probe that validation.json keeps: the rate, or with closed-loop clients the
    concurrency, first."""
    return (variable, *SIM_PROBE_KEYS)


def twin_capacity_record(found: CapacityResult) -> dict[str, Any]:
    lo, hi, var = *bracket(found), found.variable
    return {f"sim_{var}": lo, f"sim_fail_{var}": hi,
            "sim_probes": [{k: p[k] for k in probe_keys(var)} for p in found.probes]}


def capacities(outcome: Outcome) -> dict[str, dict[str, Any]]:
    """Each policy's twin capacity, and its real one where bisected, as validation.json records them."""
    caps = {policy: twin_capacity_record(found) for policy, found in outcome.twin.items()}
    for policy, real in outcome.real.items():
        var = real.variable
        lo = caps[policy][f"sim_{var}"]
        rlo, rhi = bracket(real)
        caps[policy].update({
            f"real_{var}": rlo, f"real_fail_{var}": rhi, "error_pct": pct_error(lo, rlo) if rlo > 0 else None,
            "real_probes": [{k: p.get(k) for k in (*probe_keys(var), "foreign_cpu_share")}
                            for p in real.probes]})
    return caps
