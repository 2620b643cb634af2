"""The stages of a validation (`validation.validate`'s docstring numbers them): the simulated capacity on the
twin setup, real runs at each load compared with their twins (`validation.compare`), and the real capacity;
what each finds is kept for the report."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simctl.common.errors import InputError
from simctl.results.validation_report import RunPair, fmt_err, fmt_ratio, pct_error, unavailable
from simctl.studies.capacity import SLO, CapacityResult, search_qps
from simctl.validation.compare import compare_run
from simctl.validation.machine_load import LoadMeter, wait_quiet
from simctl.validation.twin import Setup, real_dirs, simulate_twin, twin_summary

SIM_REL_TOL = 0.01  # the simulated capacity's bisection (cheap: milliseconds per probe)
SIM_MAX_PROBES = 40
REAL_REL_TOL = 0.03
REAL_STEP = 1.25  # real capacity: bracket by this factor around the simulated capacity...
MAX_REAL_PROBES = 6  # ...with at most this many real runs per policy


def bracket(result: CapacityResult) -> tuple[float, float | None]:
    """(highest rate that met the SLO, lowest rate above it that did not; None if none was probed)."""
    above = [p["qps"] for p in result.probes if not p["slo_met"] and p["qps"] > result.qps]
    return result.qps, (min(above) if above else None)


def simulated_capacity(setup: Setup, policy: str, fitted: Any, slo: SLO) -> tuple[CapacityResult, float,
                                                                                  float | None]:
    """The simulated capacity search of `policy` on the twin setup, and its bracket."""
    found = search_qps(lambda q: simulate_twin(twin_summary(setup, policy, q), fitted)[0], slo, 1.0,
                       SIM_REL_TOL, SIM_MAX_PROBES)
    return (found, *bracket(found))


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
class Validation:
    """A validation under way: its setup, cost model and SLO, and what it found so far."""

    setup: Setup
    fitted: Any
    slo: SLO
    out: Path
    quiet_wait_s: float
    say: Callable[[str], None]
    meter: LoadMeter = field(default_factory=LoadMeter)
    caps: dict[str, dict[str, Any]] = field(default_factory=dict)
    found: Findings = field(default_factory=Findings)

    def real_run(self, **kw: Any) -> tuple[dict[str, Any], float | None]:
        """A real run of the setup (its summary) and the share of the machine other processes used then."""
        from simctl.engine.real import real_main

        setup = self.setup
        if self.quiet_wait_s > 0:
            waited, share = wait_quiet(self.quiet_wait_s)
            if share is not None and share > 0.15:
                self.say(f"  the machine is busy ({share:.0%} of it used by other processes after "
                         f"{waited:.0f} s); running anyway")
        self.meter.start()
        s = real_main(workload=setup.workload.at(kw.pop("qps")), model=setup.model, dtype=setup.dtype,
                      threads=setup.threads,
                      device=setup.device, kv_budget_bytes=setup.kv_budget_bytes, attention=setup.attention,
                      eager=setup.eager,
                      prefill_instances=setup.prefill_instances, decode_instances=setup.decode_instances,
                      **kw)
        return s, self.meter.stop()

    def simulated_capacity(self, policy: str) -> None:
        slo = self.slo
        sim_cap, lo, hi = simulated_capacity(self.setup, policy, self.fitted, slo)
        if lo <= 0:
            raise InputError(f"{policy}: no simulated rate meets the SLO ({slo.describe()}); relax it")
        if hi is None:
            raise InputError(f"{policy}: the SLO ({slo.describe()}) is met at every simulated rate up to "
                             f"{lo:.3g} QPS: {self.setup.workload.num_requests} requests are served before a "
                             "queue builds; raise --num-requests (or tighten the SLO)")
        self.caps[policy] = {"sim_qps": lo, "sim_fail_qps": hi, "sim_probes": [
            {k: p[k] for k in ("qps", "slo_met", "sched_delay_p50", "tbt_p99", "ttft_p50", "sustainable",
                               "completed", "throughput_rps")} for p in sim_cap.probes]}
        self.say(f"{policy}: simulated capacity {lo:.4g} QPS ({len(sim_cap.probes)} simulated probes)")

    def run_loads(self, names: list[str], loads: list[float], repeats: int) -> None:
        """2. real runs at each load, in rounds (every policy and load once per round); 3. then each against
        its twin."""
        points = [(policy, load, load * self.caps[policy]["sim_qps"]) for policy in names for load in loads]
        foreign_shares: dict[tuple[str, float], list[float]] = {}
        for k in range(repeats):
            for policy, load, qps in points:
                run_dir = self.out / "runs" / policy / f"load_{load:g}"
                self.say(f"{policy}: real run at load {load:g} ({qps:.4g} QPS, "
                         f"{self.setup.workload.num_requests} requests)"
                         + (f", repeat {k + 1} of {repeats}" if repeats > 1 else ""))
                _, share = self.real_run(policy=policy, qps=qps, out=real_dirs(run_dir, repeats)[k])
                if share is not None:
                    foreign_shares.setdefault((policy, load), []).append(share)
        for policy, load, qps in points:
            run_dir = self.out / "runs" / policy / f"load_{load:g}"
            shares = foreign_shares.get((policy, load))
            row, ev = self.found.add(compare_run(policy, load, qps, self.caps[policy]["sim_qps"],
                                                 real_dirs(run_dir, repeats), run_dir, self.fitted, self.slo,
                                                 max(shares) if shares else None))
            self.say(f"{policy} @ {load:g}: P50 TTFT {fmt_err(row['ttft_p50_err_pct'])}, P50 TBT "
                     f"{fmt_err(row['tbt_p50_err_pct'])}, P50 E2E {fmt_err(row['e2e_p50_err_pct'])}; busy "
                     f"real/repriced {fmt_ratio(ev['busy_ratio_real_over_repriced'])}"
                     + (f" (n/a: {why})" if (why := unavailable(row)) else ""))

    def real_capacity(self, policy: str) -> None:
        """4. the real capacity, a few real runs from the simulated one: from the simulated capacity, unless a
        real run at a load already missed the SLO: then from the highest load rate that met it (the real
        capacity is above it and below the miss)."""
        slo, lo = self.slo, self.caps[policy]["sim_qps"]

        def probe(q: float) -> dict[str, Any]:
            s, foreign = self.real_run(policy=policy, qps=q,
                                       out=self.out / "capacity" / policy / f"qps_{q:.5g}")
            s["foreign_cpu_share"] = foreign
            self.say(f"{policy}: real capacity probe at {q:.4g} QPS: SLO "
                     f"{'met' if slo.met(s) else 'missed'} (median scheduling delay "
                     f"{s['sched_delay_p50']:.3g} s, other CPU "
                     f"{'n/a' if foreign is None else f'{foreign:.0%}'})")
            return s

        runs = [r for r in self.found.rows if r["policy"] == policy]
        start = lo
        if not all(r["real_slo_met"] for r in runs):
            met = [r["qps"] for r in runs if r["real_slo_met"]]
            start = max(met) if met else min(r["qps"] for r in runs) / REAL_STEP
        real_cap = search_qps(probe, slo, start, REAL_REL_TOL, MAX_REAL_PROBES, REAL_STEP)
        rlo, rhi = bracket(real_cap)
        self.caps[policy].update({
            "real_qps": rlo, "real_fail_qps": rhi,
            "error_pct": pct_error(lo, rlo) if rlo > 0 else None,
            "real_probes": [{k: p.get(k) for k in ("qps", "slo_met", "sched_delay_p50", "tbt_p99", "ttft_p50",
                                                   "sustainable", "completed", "throughput_rps",
                                                   "foreign_cpu_share")}
                            for p in real_cap.probes]})
        self.say(f"{policy}: real capacity {rlo:.4g} QPS (first failing "
                 f"{rhi if rhi is None else f'{rhi:.4g}'}), capacity error "
                 f"{fmt_err(self.caps[policy]['error_pct'])}")
