"""Goodput as DistServe defines it: the highest request rate at which a deployment meets its SLO, divided by
the GPUs it uses (rate per GPU), so that a 2-prefill/1-decode cluster compares with one colocated replica.

The SLO is `results.slo`'s: typically per-request TTFT and TPOT limits and the share of requests that must
meet both (`--attainment`, 0.9 in DistServe); the sustainable-run and scheduling-delay rules apply as in
capacity. The rate is found by `studies.capacity.search_qps` (doubling or halving, then bisection), each probe
a cluster run (`sim.cluster_run`: one replica routed through it gives the single-replica path's results). """

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simctl.common.errors import InputError
from simctl.results.slo import SLO
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig, run
from simctl.studies.capacity import (
    CapacityResult,
    check_probe_requests,
    check_start_qps,
    lowest_qps,
    search_qps,
)

if TYPE_CHECKING:
    from simctl.serving.records import RequestTable


def with_attainment(summary: dict[str, Any], requests: RequestTable, slo: SLO | None) -> dict[str, Any]:
    """The run's summary with `slo_attainment` (per-request limits) and `slo_met`, when an SLO is given."""
    if slo is None:
        return summary
    out = dict(summary)
    if slo.per_request:
        out["slo_attainment"] = slo.attainment_of(requests, summary.get("rejected", 0))
    out["slo"] = slo.describe()
    out["slo_met"] = slo.met(out)
    return out


def deployment_name(cc: ClusterConfig, tp: int = 1) -> str:
    """E.g. "2P1D", "1P1D (prefill TP2, decode TP1)" (a pool's TP not 1), "1 replica", "4 replicas TP2"."""
    if cc.disaggregated:
        p, d = cc.pool_tp("prefill", tp), cc.pool_tp("decode", tp)
        degrees = f" (prefill TP{p}, decode TP{d})" if (p, d) != (1, 1) else ""
        return f"{cc.prefill_instances}P{cc.decode_instances}D{degrees}"
    return ("1 replica" if cc.replicas == 1 else f"{cc.replicas} replicas") + (f" TP{tp}" if tp != 1 else "")


@dataclass
class Goodput:
    config: RunConfig
    cluster: ClusterConfig
    search: CapacityResult
    gpus: int

    @property
    def qps(self) -> float:
        return self.search.qps

    @property
    def per_gpu(self) -> float:
        return self.search.qps / self.gpus

    def row(self) -> dict[str, Any]:
        at = self.search.at_capacity or {}
        return {"policy": self.config.policy, "deployment": deployment_name(self.cluster, self.config.tp),
                "gpus": self.gpus,
                "goodput_qps": self.qps, "goodput_per_gpu": self.per_gpu,
                "slo_attainment": at.get("slo_attainment"), "ttft_p90": at.get("ttft_p90"),
                "tpot_p90": at.get("tpot_p90"), "probes": len(self.search.probes),
                "problem": self.search.problem}


def find_goodput(config: RunConfig, cc: ClusterConfig, slo: SLO, start_qps: float = 1.0,
                 rel_tol: float = 0.02, max_probes: int = 40) -> Goodput:
    """The highest rate meeting `slo` on the deployment `cc`, searched from `start_qps`."""
    config.validate()
    cc.validate(config.policy)
    check_start_qps(start_qps, config.workload.num_requests)
    check_probe_requests(config.workload.num_requests)
    if not slo.per_request and not slo.percentiles:
        raise InputError("--goodput needs an SLO (--slo ttft=...,tpot=..., DistServe's per-request limits)")
    gpus = 0

    def probe(qps: float) -> dict[str, Any]:
        nonlocal gpus
        r = run(config.with_workload(qps=qps), cc)
        gpus = r.summary["gpus"]
        return with_attainment(r.summary, r.result.request_columns, slo)

    search = search_qps(probe, slo, start_qps, rel_tol, max_probes,
                        min_qps=lowest_qps(config.workload.num_requests))
    return Goodput(config, cc, search, gpus)
