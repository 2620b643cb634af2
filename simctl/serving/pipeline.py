"""Pipeline parallelism in the serving loop: a replica's stages as a flow shop, and its virtual engines.

A replica of `pp` stages runs `pp` virtual engines (vLLM v0's design for pipeline parallelism: one scheduler
per virtual engine, each with its own requests and its 1/pp share of the KV blocks, a new request going to the
one with the fewest unfinished requests). Each virtual engine is the one replica loop (`serving.loop.Replica`)
with its own policy, so a policy is written once and knows nothing of stages: its loop waits for its
micro-batch to leave the last stage before it schedules again, so the requests of a micro-batch in flight are
never scheduled twice, and up to `pp` micro-batches (one per virtual engine) are in flight. The installed
vLLM (0.32, v1) keeps the same `pp` batches in flight through its batch queue (`vllm/config/vllm.py:
max_concurrent_batches`, `vllm/v1/engine/core.py: step_with_batch_queue`) with one scheduler instead.

`Pipeline` times the micro-batches its virtual engines submit: the engine's host prepares them one at a time
(the scheduler and input preparation: a step's host overhead, off the GPUs, as vLLM's driver prepares the next
micro-batch while the stages compute), then stage k of a micro-batch starts when stage k is free and the
micro-batch has crossed the boundary from stage k - 1; each boundary is a link carrying one transfer at a
time. Micro-batches are submitted in time order (the loops' clocks, a SimPy environment's
order), so every stage serves them first come first served and a micro-batch's end is known when it starts.
A stage idle while the micro-batch it waits for is still in an earlier stage or on a link is a bubble
(SARATHI's: unequal micro-batches leave later stages waiting), counted per stage.
"""

from __future__ import annotations

from collections.abc import Sequence

from simctl.serving.records import GapHistogram
from simctl.serving.router_base import ReplicaView, Router


class RequestBubbles(GapHistogram):
    """Each finished request's bubble time, in log-spaced bins: 1,000 a decade (a percentile within 0.12%), so
    that one per pipeline stays small (96 KB) in a cluster of many replicas."""

    PER_DECADE = 1_000


class Pipeline:
    """The stages and boundary links of one replica, as free times (the flow shop of the module's
    docstring), with what each stage has done."""

    def __init__(self, stages: int) -> None:
        self.stages = stages
        self._host = 0.0  # the engine's host: it prepares every virtual engine's steps, one at a time
        self._free = [0.0] * (2 * stages - 1)  # stage 0, link 0, stage 1, ..., stage pp-1
        self.busy_s = [0.0] * stages  # each stage's compute
        self.bubble_s = [0.0] * stages  # each stage's idle time while its next micro-batch was upstream
        self.micro_batches = 0
        self.last_bubble_s = 0.0  # the bubbles the last micro-batch submitted left, over the stages
        # per finished request, the bubbles of every micro-batch it was in (SARATHI's "bubble time per
        # request", Section 5.3), in constant memory
        self.request_bubbles = RequestBubbles()

    def submit(self, start: float, host_s: float, stage_times: Sequence[float], boundary_s: float) -> float:
        """A micro-batch ready at `start`, prepared by the host in `host_s`, each stage taking
        `stage_times`, each boundary `boundary_s`: the time it leaves the last stage."""
        free = self._free
        t = self._host = max(start, self._host) + host_s
        bubbles = 0.0
        for k, d in enumerate(stage_times):
            r = 2 * k
            if k:  # the boundary into stage k; stage k idle meanwhile is a bubble
                t = free[r - 1] = max(t, free[r - 1]) + boundary_s
                if t > free[r]:
                    idle = t - max(free[r], start)
                    self.bubble_s[k] += idle
                    bubbles += idle
            t = free[r] = max(t, free[r]) + d
            self.busy_s[k] += d
        self.micro_batches += 1
        self.last_bubble_s = bubbles
        return t

    def summary(self) -> dict[str, object]:
        return {"stages": self.stages, "micro_batches": self.micro_batches, "busy_s": list(self.busy_s),
                "bubble_s": list(self.bubble_s)}


class VirtualEngines:
    """A router over replicas of `pp` virtual engines each (members i*pp .. i*pp+pp-1 are replica i's): the
    pool's router picks a replica from the summed views of its engines, then the replica's engine with the
    fewest unfinished requests takes the request (vLLM v0's choice between its schedulers)."""

    def __init__(self, router: Router, pp: int) -> None:
        self.router, self.pp = router, pp

    def __call__(self, views: Sequence[ReplicaView], seq: object = None) -> int:
        pp = self.pp
        groups = [views[i:i + pp] for i in range(0, len(views), pp)]
        g = self.router([ReplicaView(sum(v.queued for v in e), sum(v.outstanding for v in e),
                                     sum(v.kv_used for v in e)) for e in groups], seq)
        engines = groups[g]
        return g * pp + min(range(pp), key=lambda i: engines[i].outstanding)
