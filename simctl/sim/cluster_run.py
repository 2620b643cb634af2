"""A simulated deployment's pools (its shape: `serving.cluster_config.ClusterConfig`, one replica, replicas
behind a router, or disaggregated prefill and decode) and what its summary reads of them: `sim.run.run`
serves every run through these, one replica being a cluster of one; the summary and the files are
`results.cluster_summary`'s and `results.output`'s, shared with the real engine.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from typing import Any

import simpy

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.costs.pipeline import StagedCost
from simctl.policies.base import Policy
from simctl.results.cluster_summary import MemberRecords, summarise_cluster
from simctl.results.run_result import SimResult
from simctl.serving.cluster_config import ClusterConfig
from simctl.serving.front_end import NO_FRONT_END, FrontEnd
from simctl.serving.kv_link import KVLink
from simctl.serving.loop import overload_limit
from simctl.serving.pipeline import Pipeline, RequestBubbles, VirtualEngines
from simctl.serving.routers import Router, RouterSettings, make_router
from simctl.sim.cluster import Cluster, Member, Pool
from simctl.sim.replica import CostBackend, StageBackend
from simctl.traces.request import Request

PLAIN_ROUTERS = ("round-robin", "least-outstanding", "least-kv", "shortest-queue")


def make_pool(name: str, count: int, gpu: str, new_backend: Callable[[], CostBackend],
              new_policy: Callable[[], Policy], router: str, cluster: Cluster, max_waiting: int | None,
              tp: int = 1, router_settings: RouterSettings | None = None, router_lag: float = 0.0,
              front_end: FrontEnd = NO_FRONT_END, pp: int = 1) -> Pool:
    """`count` replicas of `tp` GPUs each (of `pp` stages: `pp` virtual engines each, `serving.pipeline`),
    each with a policy of its own from `new_policy` and a backend from `new_backend`, behind `front_end`; its
    router sees their load as scraped every `router_lag` seconds (0: as it is)."""
    members = [Member(i, new_policy(), new_backend(), max_waiting, cluster.on_release)
               for i in range(count * pp)]
    if pp > 1:  # a plain router (check_pipelined) picks the replica, then the replica its engine
        chosen: Router = VirtualEngines(make_router(router, (), router_settings), pp)
    else:
        chosen = make_router(router, [m.policy.kv for m in members], router_settings)
    return Pool(name, members, chosen, gpu, tp, router_lag, front_end)


def check_pipelined(pp: int, cc: ClusterConfig, timeline: int) -> None:
    """What pipeline parallelism is not built with: disaggregated pools, cache-aware routers (they read one
    KV cache per replica), a timeline (one replica's one loop)."""
    if pp == 1:
        return
    if cc.disaggregated:
        raise InputError("--pp > 1 serves colocated replicas only; disaggregated pools take --tp")
    if cc.router not in PLAIN_ROUTERS:
        raise InputError(f"--pp > 1 takes the routers {', '.join(PLAIN_ROUTERS)}; {cc.router} reads one KV "
                         "cache per replica, and a pipeline-parallel replica keeps one per virtual engine")
    if timeline:
        raise InputError("--timeline records one replica loop; a pipeline-parallel replica runs one a stage")


def stage_backends(cost: CostModel, staged: StagedCost) -> Callable[[], CostBackend]:
    """A backend per virtual engine, called in member order: each run of `staged.stages` consecutive calls
    shares one replica's `Pipeline`."""
    made: list[Pipeline] = []
    calls = itertools.count()

    def new() -> CostBackend:
        if next(calls) % staged.stages == 0:
            made.append(Pipeline(staged.stages))
        return StageBackend(cost, staged, made[-1])
    return new


def pipeline_summary(pool: Pool, makespan_s: float) -> dict[str, Any]:
    """The stages' work and bubbles summed over the pool's replicas, and the bubbles' share of the stages'
    time over the run."""
    pipelines = list({id(p): p for p in (m.replica.backend.pipeline for m in pool.members)}.values())
    busy = [sum(p.busy_s[k] for p in pipelines) for k in range(pipelines[0].stages)]
    bubble = [sum(p.bubble_s[k] for p in pipelines) for k in range(pipelines[0].stages)]
    span = makespan_s * len(pipelines) * len(busy)
    per_request = RequestBubbles()
    for p in pipelines:
        per_request.merge(p.request_bubbles)
    p50, p90 = per_request.percentiles((50, 90))
    return {"stages": len(busy), "micro_batches": sum(p.micro_batches for p in pipelines), "busy_s": busy,
            "bubble_s": bubble, "bubble_share": sum(bubble) / span if span > 0 else 0.0,
            "busy_share": sum(busy) / span if span > 0 else 0.0,
            "request_bubble_p50_s": p50, "request_bubble_p90_s": p90}


def pool_records(pool: Pool) -> list[MemberRecords]:
    """What the cluster's summary reads of each replica of `pool`."""
    return [_records(pool, m) for m in pool.members]


def _records(pool: Pool, m: Member) -> MemberRecords:
    r, p = m.replica.records, m.replica.policy
    return MemberRecords(pool.name, m.index, pool.gpu, r.iterations, r.gaps, r.queue_lengths(), m.seqs,
                         m.replica.aborted, p.kv.capacity, pool.tp, type(p).summarise_stats(p.stats()))


def simulate_disaggregated(requests: list[Request], new_policy: Callable[[], Policy], cost: CostModel,
                           link_gbps: float, kv_bytes_per_token: int, head: dict[str, Any]
                           ) -> tuple[SimResult, dict[str, Any]]:
    """One prefill and one decode instance, each with a policy from `new_policy`, priced by `cost`, the KV
    crossing a link of `link_gbps`: the simulated twin of a real disaggregated run (`engine.disagg`)."""
    t0 = time.perf_counter()
    cluster = Cluster(simpy.Environment(), KVLink(link_gbps), kv_bytes_per_token)
    limit = overload_limit([r.arrival_s for r in requests])
    cluster.entry = make_pool("prefill", 1, "", lambda: CostBackend(cost), new_policy, "round-robin", cluster,
                              limit)
    cluster.decode = make_pool("decode", 1, "", lambda: CostBackend(cost), new_policy, "round-robin", cluster,
                               limit)
    seqs = cluster.run(requests)
    members = [r for p in (cluster.entry, cluster.decode) for r in pool_records(p)]
    return summarise_cluster(head, members, seqs, cluster.link, cluster.aborted,
                             cluster.decode.members[0].policy.kv.capacity, time.perf_counter() - t0)
