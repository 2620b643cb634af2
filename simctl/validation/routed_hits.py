"""A routed cluster's prefix caches against real engines (issue 40 item 4): the twin routes a trace across
replicas, each its own vllm-v1 configured as the real engine; then one real vLLM serves each replica's share
in turn, one request at a time (its prefix cache reset between shares, so each share starts cold as each
replica did). Checked per replica: vLLM's cached tokens request by request against the twin's serving that
share one after another in vLLM's order (`prefix_hits.serial_hits`), the routed replica's hit total against
vLLM's, and the routed replica's final cached blocks against the serial twin's (vLLM's own blocks are not
visible from outside; the twin's serial replay is what the per-request check ties to them).

Two cores cannot run two vLLM instances side by side with useful timing, so the routing is the twin's and
only what each replica caches is checked; with one request in flight at a time what a request finds cached
depends only on the requests before it, not on when they ran. A share holds a session's every turn or none
(vLLM resends the ids it generated for the turn before): the session router keeps them together, the others
may not (`traces.tokens.SessionPrompts` then refuses the share)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simctl.catalogue.gpus import get_gpu
from simctl.costs.loader import load_cost
from simctl.sim.simulate import simulate_routed
from simctl.traces.request import Request
from simctl.validation.prefix_hits import serial_hits
from simctl.validation.twin import vllm_twin

if TYPE_CHECKING:
    from simctl.engine.vllm_real import VLLMServer


@dataclass
class ReplicaCheck:
    replica: int
    served: list[int]  # ids of the requests the twin routed there, in the order vLLM served them
    vllm: list[int]  # vLLM's cached tokens for each (its num_cached_tokens)
    twin: list[int]  # the twin's hits for each, serving them one after another in that order
    routed_hits: int  # the routed twin replica's hits (tokens), as the cluster served them
    routed_blocks: int  # blocks the routed replica caches at the end
    same_blocks: bool  # the routed replica's cached blocks are the serial twin's

    @property
    def equal(self) -> int:
        """Requests whose cached tokens the twin and vLLM agree on."""
        return sum(a == b for a, b in zip(self.vllm, self.twin))


def check_routed(requests: list[Request], server: VLLMServer, router: str, replicas: int, seed: int = 0
                 ) -> list[ReplicaCheck]:
    """Route `requests` across `replicas` twins of `server`'s engine with `router` (priced by the roofline of
    `server`'s model on the CPU: the times only order the cluster's events), then serve each replica's share
    on `server` at concurrency 1 (`seed`: the prompts' token ids)."""
    settings = server.settings()
    routed = [vllm_twin(settings) for _ in range(replicas)]
    cost = load_cost(None, server.spec, get_gpu("cpu")).cost
    shares = simulate_routed(requests, routed, cost, router)
    by_id = {r.id: r for r in requests}
    checks = []
    for i, (ids, policy) in enumerate(zip(shares, routed)):
        share = sorted((by_id[j] for j in ids), key=lambda r: (r.arrival_s, r.id))
        if not share:  # the router sent it nothing: nothing to serve, nothing cached
            checks.append(ReplicaCheck(i, [], [], [], policy.hits, len(policy.kv.cached),
                                       not policy.kv.cached))
            continue
        run = server.serve(share, seed, concurrency=1)
        req = run.result.requests
        order = np.argsort(req["arrival_s"].to_numpy(), kind="stable")  # one in flight: sent = served
        served = [int(j) for j in req["request_id"].to_numpy()[order]]
        serial = vllm_twin(settings)
        hits = serial_hits([by_id[j] for j in served], serial)
        checks.append(ReplicaCheck(i, served, [int(c) for c in req["prefix_cached_tokens"].to_numpy()[order]],
                                   hits, policy.hits, len(policy.kv.cached),
                                   set(policy.kv.cached) == set(serial.kv.cached)))
    return checks


def as_row(check: ReplicaCheck) -> dict[str, Any]:
    return {"replica": check.replica, "requests": len(check.served), "vllm_cached": sum(check.vllm),
            "twin_serial_cached": sum(check.twin), "twin_routed_cached": check.routed_hits,
            "equal": check.equal, "routed_blocks": check.routed_blocks, "same_blocks": check.same_blocks}
