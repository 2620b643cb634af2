"""A real deployment, as the simulator's (`sim.run`): one engine is a deployment of one, a prefill and a
decode instance (`simctl.engine.disagg`) a deployment of two. Either way each engine runs the one serving loop
(`engine.serve.Engine.run`) on the requests `serving.handoff.arrivals` makes, and their records are summarised
as the simulated cluster's (`results.cluster_summary.summarise_cluster`), so `simctl real` writes what
`simctl run` writes."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

from simctl.engine.serve import EngineResult, Instance, Served
from simctl.engine.setup import RealConfig, RealRun, Sizing, build_engine
from simctl.results.cluster_summary import (
    MemberRecords,
    closed_loop_summary,
    iterations_frame,
    summarise_cluster,
)
from simctl.serving.clients import Clients
from simctl.serving.loop import overload_limit
from simctl.traces.request import Request

if TYPE_CHECKING:
    import torch


def serve_deployment(config: RealConfig, size: Sizing, requests: list[Request], model: torch.nn.Module
                     ) -> tuple[RealRun, Served]:
    """Serve `requests` on `config`'s deployment, this process's engine on `model`: its records and summary
    in the cluster's form, and what was served."""
    if config.disaggregated:  # this process is the decode instance; the prefill instance is its child
        from simctl.engine.disagg import serve_pair

        served = serve_pair(config, size, requests, model)
    else:
        served = _serve_one(config, size, requests, model)
    return _summarised(config, requests, served), served


def _serve_one(config: RealConfig, size: Sizing, requests: list[Request], model: torch.nn.Module) -> Served:
    engine, warm_s = build_engine(config, requests, size, model)
    clients = Clients(requests, config.workload.concurrency, config.workload.think_time)
    limit = overload_limit([r.arrival_s for r in requests])
    if clients.closed_loop:
        out = engine.serve_clients(requests, clients, max_waiting=limit)
    else:
        out = engine.serve(requests, max_waiting=limit)
    return Served(engine, warm_s, [Instance("replicas", out, out.seqs)], out.seqs, out.tokens)


def _summarised(config: RealConfig, requests: list[Request], served: Served) -> RealRun:
    """The records of every instance merged as the simulated cluster's, with its summary."""
    kv = served.engine.policy.kv.capacity  # every instance's policy is sized alike
    outs = [i.result for i in served.instances]
    members = [MemberRecords(i.pool, 0, config.device, o.iterations, o.gaps, o.queue_at_arrival, i.seqs,
                             o.aborted, kv) for i, o in zip(served.instances, outs, strict=True)]
    aborted = any(o.aborted for o in outs)
    wall = max(o.wall_s for o in outs)
    head = {"mode": "real", **config.recorded()}
    result, summary = summarise_cluster(head, members, served.seqs, served.link, aborted, kv, wall)
    result.request_columns.update({name: np.asarray(values) for name, values in served.columns.items()})
    if config.workload.concurrency is not None:
        summary.update(closed_loop_summary(result.request_columns, summary["makespan_s"]))
    engine = EngineResult(seqs=served.seqs, iterations=result.iterations, gaps=result.gaps,
                          queue_at_arrival=result.queue_at_arrival, aborted=aborted, wall_s=wall,
                          tokens=served.tokens, forward_s=np.concatenate([o.forward_s for o in outs]),
                          peak_slots=max(o.peak_slots for o in outs))
    return RealRun(config, requests, summary, result, engine, iterations=iterations_frame(members),
                   replicas=pd.DataFrame(summary["replica_metrics"]))
