"""Capacity: the highest request rate a replica sustains while meeting its SLOs (Sarathi-Serve, Section 5.1),
found by bisection over QPS."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from sim.run import RunConfig, run


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


@dataclass
class CapacityResult:
    qps: float  # highest probed rate that met the SLO (0 if none did)
    probes: list[dict[str, Any]]  # every run's summary, in probe order


def find_capacity(config: RunConfig, slo: SLO, start_qps: float = 1.0, rel_tol: float = 0.02,
                  max_probes: int = 30) -> CapacityResult:
    """Double (or halve) from `start_qps` to bracket the capacity, then bisect to `rel_tol`."""
    probes: list[dict[str, Any]] = []

    def ok(qps: float) -> bool:
        s = run(replace(config, qps=qps)).summary
        s["slo_met"] = slo.met(s)
        probes.append(s)
        return s["slo_met"]

    lo, hi = 0.0, start_qps
    if ok(hi):
        lo = hi
        while len(probes) < max_probes:
            hi = lo * 2
            if not ok(hi):
                break
            lo = hi
    else:
        while len(probes) < max_probes and hi > 1e-4:
            hi /= 2
            if ok(hi):
                lo, hi = hi, hi * 2
                break
    while lo > 0 and hi - lo > rel_tol * lo and len(probes) < max_probes:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return CapacityResult(lo, probes)
