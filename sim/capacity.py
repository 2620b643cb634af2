"""Capacity: the highest request rate a replica sustains while meeting its SLOs (Sarathi-Serve, Section 5.1),
found by bisection over QPS."""

from __future__ import annotations

import math
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from common.checks import is_int, is_number
from common.errors import InputError
from sim.run import MAX_CLOCK_S, RunConfig, run


@dataclass(frozen=True)
class SLO:
    tbt_p99_s: float | None = None  # e.g. 0.1 strict / 0.5 relaxed for Mistral-7B on an A100 (Table 3)
    sched_delay_p50_s: float = 2.0  # "the queuing delay does not blow up"
    ttft_p50_s: float | None = None

    def met(self, s: dict[str, Any]) -> bool:
        if not s["sustainable"] or s["completed"] < s["num_requests"]:
            return False
        checks = ((self.tbt_p99_s, s["tbt_p99"]), (self.sched_delay_p50_s, s["sched_delay_p50"]),
                  (self.ttft_p50_s, s["ttft_p50"]))
        return all(limit is None or (value is not None and value <= limit) for limit, value in checks)

    def describe(self) -> str:
        parts = [f"P99 TBT <= {self.tbt_p99_s} s" if self.tbt_p99_s is not None else "",
                 f"P50 TTFT <= {self.ttft_p50_s} s" if self.ttft_p50_s is not None else "",
                 f"P50 scheduling delay <= {self.sched_delay_p50_s} s", "sustainable"]
        return ", ".join(p for p in parts if p)

    def validate(self) -> None:
        for name, v in (("--slo-tbt-p99", self.tbt_p99_s), ("--slo-ttft-p50", self.ttft_p50_s),
                        ("--slo-sched-p50", self.sched_delay_p50_s)):
            if v is not None and not (v > 0 and math.isfinite(v)):
                raise InputError(f"{name} must be a positive number of seconds, got {v}")


MAX_QPS = 1e9  # the search stops doubling here: no replica serves a billion requests a second
MIN_QPS = 1e-4  # ... and stops halving here (one request every 3 hours)
# Fewer requests per probe end before a queue can build up: every rate looks sustainable, and the search would
# report its own limit instead of the replica's capacity.
MIN_PROBE_REQUESTS = 100


def lowest_qps(num_requests: int) -> float:
    """The lowest rate a search probes: MIN_QPS, or the rate below which `num_requests` would arrive beyond
    the simulated clock."""
    return max(MIN_QPS, num_requests / MAX_CLOCK_S)


def check_start_qps(start_qps: float, num_requests: int) -> None:
    """Refuse a first rate outside the rates the search probes: it would name the wrong limit or none."""
    lowest = lowest_qps(num_requests) if is_int(num_requests) and num_requests > 0 else MIN_QPS
    if not (is_number(start_qps) and lowest <= start_qps <= MAX_QPS):
        raise InputError(f"--start-qps must be a rate from {lowest:.3g} to {MAX_QPS:.3g} requests per second "
                         f"(the rates a search probes), got {start_qps!r}")


def check_probe_requests(num_requests: int) -> None:
    if num_requests < MIN_PROBE_REQUESTS:
        raise InputError(f"--num-requests {num_requests}: a capacity search needs at least {MIN_PROBE_REQUESTS} "
                         "requests per probe; shorter runs end before a queue can build up, so every rate "
                         "would look sustainable")


@dataclass
class CapacityResult:
    qps: float  # highest probed rate that met the SLO (0 if none did)
    probes: list[dict[str, Any]]  # every run's summary, in probe order

    @property
    def at_capacity(self) -> dict[str, Any] | None:
        return next((p for p in self.probes if p["qps"] == self.qps and p["slo_met"]), None)

    @property
    def problem(self) -> str | None:
        """Why `qps` is not a capacity (None when a probe met the SLO and a higher one missed it)."""
        if self.qps == 0:
            lowest = min((p["qps"] for p in self.probes), default=0.0)
            return f"no rate met the SLO, down to {lowest:.3g} QPS: the capacity is below it, or nothing meets the SLO"
        if not any(not p["slo_met"] and p["qps"] > self.qps for p in self.probes):
            return f"no upper bound: every rate probed, up to {self.qps:.3g} QPS, met the SLO"
        return None

    @property
    def warnings(self) -> list[str]:
        """The cost model's warnings (a calibration of another GPU or model), which every probe carries."""
        return list(self.probes[0].get("warnings", [])) if self.probes else []


def search_qps(probe: Callable[[float], dict[str, Any]], slo: SLO, start_qps: float = 1.0,
               rel_tol: float = 0.02, max_probes: int = 30, step: float = 2.0,
               min_qps: float = MIN_QPS) -> CapacityResult:
    """The highest QPS whose run meets `slo`: multiply (or divide) `start_qps` (moved within min_qps..MAX_QPS)
    by `step` until the capacity is bracketed (within those limits), then bisect to `rel_tol`, running at most
    `max_probes` probes.
    `probe(qps)` returns a run's summary; each is kept, with `slo_met` added, in probe order. Simulated runs
    and real runs (engine/validate.py) share it. `CapacityResult.problem` says when no capacity was found."""
    probes: list[dict[str, Any]] = []

    def ok(qps: float) -> bool:
        s = dict(probe(qps))
        s["qps"] = qps
        s["slo_met"] = slo.met(s)
        probes.append(s)
        return s["slo_met"]

    lo, hi = 0.0, min(max(start_qps, min_qps), MAX_QPS)  # from beyond a limit, the probes run out first
    if ok(hi):
        lo = hi
        while len(probes) < max_probes and lo < MAX_QPS:
            hi = min(lo * step, MAX_QPS)
            if not ok(hi):
                break
            lo = hi
    else:
        while len(probes) < max_probes and hi > min_qps:
            hi = max(hi / step, min_qps)
            if ok(hi):
                lo, hi = hi, hi * step
                break
    while lo > 0 and hi - lo > rel_tol * lo and len(probes) < max_probes:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return CapacityResult(lo, probes)


def find_capacity(config: RunConfig, slo: SLO, start_qps: float = 1.0, rel_tol: float = 0.02,
                  max_probes: int = 60) -> CapacityResult:
    """The capacity of one simulated configuration."""
    return search_qps(lambda qps: run(replace(config, qps=qps)).summary, slo, start_qps, rel_tol, max_probes,
                      min_qps=lowest_qps(config.num_requests))


@dataclass(frozen=True)
class CapacityConfig:
    """Capacity searches to run side by side: one per configuration (typically one per policy)."""

    configs: list[RunConfig]
    slo: SLO
    start_qps: float = 1.0
    workers: int | None = None  # processes; None: one per core

    def validate(self) -> None:
        if not self.configs:
            raise InputError("no policy given")
        names = [c.policy for c in self.configs]
        if len(set(names)) != len(names):
            raise InputError(f"a policy is listed twice: {', '.join(names)}")
        check_start_qps(self.start_qps, self.configs[0].num_requests)  # before the configs' own --qps check
        for c in self.configs:
            c.validate()
        check_probe_requests(self.configs[0].num_requests)
        self.slo.validate()
        if self.workers is not None and self.workers < 1:
            raise InputError(f"--workers must be >= 1, got {self.workers}")


def capacity_warnings(results: dict[str, CapacityResult]) -> list[str]:
    """Every search's cost-model warnings, each once (the searches share the cost model)."""
    return list(dict.fromkeys(w for r in results.values() for w in r.warnings))


def _search_named(args: tuple[RunConfig, SLO, float]) -> tuple[str, CapacityResult]:
    config, slo, start_qps = args
    return config.policy, find_capacity(config, slo, start_qps)


def _quiet_worker() -> None:
    """Signals are the parent's business: Ctrl-C reaches the whole process group, and the parent terminates
    its workers (SIGTERM) once it has stopped; a worker just ends, without a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def search_capacities(spec: CapacityConfig, progress: bool = False) -> dict[str, CapacityResult]:
    """Run each configuration's search in a local process pool (searches are independent and CPU-bound). On
    any exception, an interruption included, the workers are terminated before it propagates."""
    jobs = [(c, spec.slo, spec.start_qps) for c in spec.configs]
    workers = min(spec.workers or os.cpu_count() or 1, len(jobs))
    if workers == 1:
        return dict(map(_search_named, jobs))
    from multiprocessing import Pool

    from rich.progress import Progress

    results: dict[str, CapacityResult] = {}
    pool = Pool(workers, initializer=_quiet_worker)
    try:
        with Progress(disable=not progress, transient=True) as bar:
            task = bar.add_task("capacity searches", total=len(jobs))
            for name, result in pool.imap_unordered(_search_named, jobs):
                results[name] = result
                bar.advance(task)
        pool.close()
    finally:
        pool.terminate()
        pool.join()
    return {c.policy: results[c.policy] for c in spec.configs}
