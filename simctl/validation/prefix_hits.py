"""The twin's prefix-cache hits request by request, for runs at concurrency 1: each request served alone, in
the order the real run served them, through one vllm-v1 policy, so the KV pool carries every earlier
request's cached blocks and evictions as the engine's did. With one request in flight, what is cached when a
request arrives depends only on the requests before it, not on when they ran, so a real run's per-request
`prefix_cached_tokens` (vLLM's `num_cached_tokens`) can be checked token for token."""

from __future__ import annotations

from dataclasses import replace

from simctl.costs.base import CostModel
from simctl.policies.plan import BatchPlan
from simctl.policies.vllm_v1 import VLLMV1
from simctl.sim.simulate import simulate
from simctl.traces.request import Request


class _Step(CostModel):
    """Every iteration 1 ms: one request at a time, the times say nothing about its hits."""

    def iteration_time(self, plan: BatchPlan) -> float:
        return 1e-3


def serial_hits(requests: list[Request], policy: VLLMV1) -> list[int]:
    """The prompt tokens `policy` finds cached for each of `requests`, served one after another in the order
    given (each alone, sent at once: its session turn's predecessor, if any, has completed before it)."""
    hits = []
    for r in requests:
        before = policy.hits  # its lookup at admission (alone, it is never preempted)
        simulate([replace(r, arrival_s=0.0, previous=-1, think_s=0.0)], policy, _Step())
        hits.append(policy.hits - before)
    return hits
