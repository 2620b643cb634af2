"""What a deployment's run yields, simulated or real: its summary (`summarise_cluster`: the single-run
metrics of `results.metrics.summarise_result` over every request, token gap and iteration of the cluster, plus
per replica and per pool: requests served, utilisation (busy time / the run's span), the waiting queue each
arrival met, KV peak; and the KV link's use), each replica's row of replicas.parquet, and the iterations
table. The cluster is sustainable when every replica is, by the single-replica rules applied to the requests
it served.

`sim.cluster_run` and `engine.deployment` both hand their replicas' records here as `MemberRecords`, so
`simctl real` writes what `simctl run` writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from simctl.policies.seq import Seq
from simctl.results.metrics import summarise_result
from simctl.results.run_result import SimResult
from simctl.serving.kv_link import KVLink
from simctl.serving.records import GapHistogram, IterationLog, request_columns

if TYPE_CHECKING:
    import pandas as pd


def _merged(logs: list[IterationLog]) -> IterationLog:
    out = IterationLog()
    for log in logs:
        for name in ("start", "duration", "count", "prefill_tokens", "decode_tokens", "batch_size",
                     "linear_tokens", "kv_used"):
            getattr(out, name).extend(getattr(log, name))
    return out


@dataclass
class MemberRecords:
    """What the cluster's summary reads of one replica: a simulated member's, or a real engine's."""

    pool: str  # "replicas" (colocated), "prefill" or "decode"
    index: int
    gpu: str
    iterations: IterationLog
    gaps: GapHistogram
    queue: np.ndarray  # the waiting queue each request met on arrival
    seqs: list[Seq]  # every request it served (a prefill instance's copies)
    aborted: bool
    kv_capacity: int
    tp: int = 1  # GPUs of its tensor-parallel group
    # what its policy counted, as a summary gives it (`Policy.summarise_stats`: vllm-v1's prefix-cache hits)
    stats: dict[str, Any] = field(default_factory=dict)

    def result(self) -> SimResult:
        return SimResult(request_columns=request_columns(self.seqs), iterations=self.iterations,
                         gaps=self.gaps, queue_at_arrival=self.queue, aborted=self.aborted,
                         kv_capacity=self.kv_capacity, wall_s=0.0)


def replica_row(pool: str, index: int, gpu: str, s: dict[str, Any], iterations: IterationLog,
                queue: np.ndarray, span: float) -> dict[str, Any]:
    """One replica's row of replicas.parquet (and the summary's `replica_metrics`): `s` its metrics
    (`summarise_result`), `iterations` its iteration records, `queue` the queue each of its arrivals found."""
    busy = float(np.frombuffer(iterations.duration, dtype=np.float64).sum())
    return {"pool": pool, "replica": index, "gpu": gpu, "requests": s["num_requests"],
            "completed": s["completed"], "busy_s": busy, "utilisation": busy / span if span > 0 else 0.0,
            "queue_mean": float(queue.mean()) if len(queue) else 0.0,
            "queue_max": int(queue.max()) if len(queue) else 0,
            "kv_peak_tokens": s["kv_peak_tokens"], "kv_capacity_tokens": s["kv_capacity_tokens"],
            "iterations": s["iterations"], "preemptions": s["preemptions"],
            "sustainable": s["sustainable"], "unsustainable_reason": s["unsustainable_reason"]}


def summarise_cluster(head: dict[str, Any], members: list[MemberRecords], seqs: list[Seq],
                      link: KVLink | None, aborted: bool, kv_capacity: int,
                      wall_s: float) -> tuple[SimResult, dict[str, Any]]:
    """The cluster's records (every request, token gap and iteration) and summary: `head` (its configuration),
    the single-run metrics over all of it, and per replica, per pool and for the link."""
    gaps = GapHistogram()
    for m in members:
        gaps.merge(m.gaps)
    columns = request_columns(seqs)
    _placement_columns(columns, members, seqs)
    entry = [m for m in members if m.pool != "decode"]
    result = SimResult(request_columns=columns, iterations=_merged([m.iterations for m in members]),
                       gaps=gaps, queue_at_arrival=np.concatenate([m.queue for m in entry]), aborted=aborted,
                       kv_capacity=kv_capacity, wall_s=wall_s)
    summary = {**head, **summarise_result(result)}
    span = summary["makespan_s"]
    rows = [replica_row(m.pool, m.index, m.gpu, summarise_result(m.result()) if len(members) > 1 else summary,
                        m.iterations, m.queue, span)  # one replica: its metrics are the run's
            for m in members]
    if len(members) > 1:  # each replica's counts (its prefix-cache hit rate); one replica's are the run's
        rows = [{**row, **m.stats} for row, m in zip(rows, members)]
    unsustainable = [f"{r['pool']} {r['replica']}: {r['unsustainable_reason']}"
                     for r in rows if not r["sustainable"]]
    if len(rows) > 1 and unsustainable:  # one replica: the run's own verdict, as `simctl.sim.run`'s
        summary["sustainable"] = False
        summary["unsustainable_reason"] = "; ".join(unsustainable)
    summary["gpus"] = sum(m.tp for m in members)  # each replica's TP group
    pools = dict.fromkeys(m.pool for m in members)
    summary["pools"] = {name: _pool_summary(name, next(m.gpu for m in members if m.pool == name),
                                            [r for r in rows if r["pool"] == name]) for name in pools}
    if link is not None:
        summary["kv_link"] = _link_summary(link, span)
    summary["replica_metrics"] = rows
    return result, summary


def closed_loop_summary(columns: dict[str, np.ndarray], makespan_s: float) -> dict[str, Any]:
    """What a closed loop's summary adds: the requests in flight on average over the run (Little's law: the
    time requests spent in the system, send to completion, over the run's span), which a closed loop holds at
    its concurrency while every client is busy; its throughput is the summary's `throughput_rps`."""
    done = columns["completion_s"] >= 0
    busy = float((columns["completion_s"][done] - columns["arrival_s"][done]).sum())
    return {"in_flight_mean": busy / makespan_s if makespan_s > 0 else 0.0}


def _placement_columns(columns: dict[str, np.ndarray], members: list[MemberRecords], seqs: list[Seq]) -> None:
    """Where each request ran: its replica, or its prefill and decode instances and when its prefill ended."""
    index = {s.id: i for i, s in enumerate(seqs)}

    def placed(pool: str) -> np.ndarray:
        where = np.full(len(seqs), -1, dtype=np.int64)
        for m in members:
            if m.pool == pool:
                where[[index[s.id] for s in m.seqs]] = m.index
        return where

    if all(m.pool == "replicas" for m in members):
        columns["replica"] = placed("replicas")
        return
    columns["prefill_replica"] = placed("prefill")
    columns["decode_replica"] = placed("decode")
    done = np.full(len(seqs), -1.0)
    for m in members:
        if m.pool == "prefill":
            for s in m.seqs:
                done[index[s.id]] = s.completion_s
    columns["prefill_done_s"] = done


def _pool_summary(name: str, gpu: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    util = [r["utilisation"] for r in rows]
    return {"instances": len(rows), "gpu": gpu, "requests": sum(r["requests"] for r in rows),
            "utilisation_mean": float(np.mean(util)), "utilisation_max": float(np.max(util)),
            "queue_max": max(r["queue_max"] for r in rows),
            "kv_peak_tokens": max(r["kv_peak_tokens"] for r in rows)}


def _link_summary(link: KVLink, span: float) -> dict[str, Any]:
    ready, start, end = (np.frombuffer(a, dtype=np.float64) for a in (link.ready, link.start, link.end))
    busy = float((end - start).sum())
    took, waited = end - ready, start - ready

    def pct(values: np.ndarray, p: int) -> float | None:
        return float(np.percentile(values, p)) if len(values) else None

    return {"gbps": link.gbps, "transfers": len(ready), "bytes": link.bytes, "busy_s": busy,
            "utilisation": busy / span if span > 0 else 0.0,
            "transfer_s_mean": float(took.mean()) if len(took) else None, "transfer_s_p50": pct(took, 50),
            "transfer_s_p99": pct(took, 99), "wait_s_p50": pct(waited, 50), "wait_s_p99": pct(waited, 99)}


def iterations_frame(members: list[MemberRecords]) -> pd.DataFrame:
    """Every replica's iteration rows, with the pool and replica that ran them."""
    import pandas as pd  # only where the table is asked for (files, plots): a summary needs none

    frames = []
    for m in members:
        f = m.iterations.frame()
        f.insert(0, "replica", m.index)
        f.insert(0, "pool", m.pool)
        frames.append(f)
    return pd.concat(frames, ignore_index=True)
