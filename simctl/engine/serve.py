"""Real execution: the simulator's replica loop (`simctl.serving.loop.Replica`) on the monotonic clock
(`serving.realtime.RealTime`), with a backend that runs each plan instead of pricing it (`TorchBackend` over
an `Executor`: `executor.plans.PlanExecutor`, one forward per plan on the RaggedExecutor, greedy tokens): its
end is the clock once the sampled tokens exist (cuda: after a synchronize), and the loop then applies the very
bookkeeping the simulator runs (`serving.bookkeeping`: advance Seqs, stamp times, TBT gaps, iteration row,
policy.finish), after which the executor gives back the KV slots of finished requests.

One iteration at a time (no decode stretches). An iteration's `start` is the clock read before arrivals are
drained and the policy schedules, so its logged duration covers scheduling, input preparation, the forward
and the LM head; sampling (argmax) and bookkeeping fall between iterations. Token gaps (TBT) are measured from
token stamp to token stamp and so include everything.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from simctl.executor.plans import PlanExecutor
from simctl.executor.ragged import RaggedExecutor, Segment
from simctl.policies.base import Policy
from simctl.policies.plan import BatchPlan
from simctl.policies.seq import Seq
from simctl.results.run_result import SimResult
from simctl.serving.clients import Clients
from simctl.serving.executor import Executor
from simctl.serving.handoff import arrivals
from simctl.serving.inbox import Inbox
from simctl.serving.kv_link import KVLink
from simctl.serving.loop import Replica
from simctl.serving.real_clients import RealClients
from simctl.serving.realtime import RealTime
from simctl.serving.records import GapHistogram, IterationLog, request_columns
from simctl.serving.routed import RoutedInbox
from simctl.traces.request import Request


def prompt_ids(request_id: int, length: int, vocab_size: int, seed: int = 0) -> list[int]:
    """The prompt token ids of one request: uniform over the vocabulary, from a generator seeded by
    (seed, request id) only, so a request has the same prompt alone and inside any trace."""
    rng = np.random.default_rng([int(seed), int(request_id)])
    return rng.integers(0, vocab_size, int(length)).tolist()


@dataclass
class EngineResult:
    seqs: list[Seq]  # in arrival order, with measured times (seconds from the run's start)
    iterations: IterationLog  # one row per iteration (count 1)
    gaps: GapHistogram
    queue_at_arrival: np.ndarray
    aborted: bool
    wall_s: float  # the serving loop, first arrival wait included
    tokens: dict[int, list[int]]  # request id -> generated token ids
    forward_s: np.ndarray  # per iteration: inputs, forward and LM head (synchronized), without scheduling
    peak_slots: int  # most KV slots held at once

    def sim_result(self, kv_capacity: int) -> SimResult:
        """The records in the simulator's form, for `simctl.results.metrics.summarise_result` and
        `simctl.results.output.write_run`."""
        return SimResult(request_columns=request_columns(self.seqs), iterations=self.iterations,
                         gaps=self.gaps, queue_at_arrival=self.queue_at_arrival, aborted=self.aborted,
                         kv_capacity=kv_capacity, wall_s=self.wall_s)


@dataclass
class Instance:
    """What one engine of a deployment served."""

    pool: str  # "replicas" (a lone engine), "prefill" or "decode"
    result: EngineResult
    seqs: list[Seq]  # the requests it was handed, in order (a prefill instance's copies)


@dataclass
class Served:
    """A real deployment's run (`engine.deployment`): one engine, or a prefill and a decode instance."""

    engine: Engine  # this process's engine (a pair's decode instance)
    warmup_s: float  # the longest warm-up of its engines
    instances: list[Instance]
    seqs: list[Seq]  # every request's final state, in arrival order
    tokens: dict[int, list[int]]  # request id -> generated token ids
    link: KVLink | None = None  # a pair's measured link
    columns: dict[str, list[float]] = field(default_factory=dict)  # the requests table's extra columns
    fields: dict[str, Any] = field(default_factory=dict)  # what the summary adds


class TorchBackend:
    """The replica loop's backend in real mode: each plan runs on an `Executor` (the torch `PlanExecutor`),
    its end stamped on the real-time clock once the sampled tokens exist."""

    def __init__(self, executor: Executor, time: RealTime,
                 on_iteration: Callable[[BatchPlan, float, float, float], None] | None = None,
                 on_release: Callable[[list[Seq]], None] | None = None) -> None:
        self.executor = executor
        self.time = time
        self.on_iteration = on_iteration
        self.on_release = on_release  # sees finished sequences while they still hold their KV
        self.forward_s: list[float] = []
        self.sampled: list[Seq] = []  # the last iteration's sampling sequences, checked after bookkeeping

    def run(self, plan: BatchPlan, start: float) -> float:
        self._check_counts()
        t_exec = self.time.read()
        self.sampled = [s for s, _ in self.executor.execute(plan)]
        end = self.time.read()
        self.forward_s.append(end - t_exec)
        if self.on_iteration is not None:
            self.on_iteration(plan, start, end, end - t_exec)
        return end

    def stretch_times(self, plan: BatchPlan, k: int) -> None:
        return None  # real iterations run one at a time

    def _check_counts(self) -> None:
        """The previous iteration's bookkeeping counted exactly the tokens the model produced."""
        for s in self.sampled:
            n = len(self.executor.tokens(s.id))
            if n != s.generated:
                raise RuntimeError(
                    f"request {s.id}: {n} tokens generated but the policy counts {s.generated}")

    def release(self, finished: list[Seq]) -> None:
        if self.on_release is not None:
            self.on_release(finished)
        self.executor.release(finished)


class Engine:
    """Drives `policy` over `executor` (a `executor.ragged.RaggedExecutor`) for one list of requests, with
    the replica loop the simulator runs (`simctl.serving.loop.Replica`) on the real-time clock."""

    def __init__(self, policy: Policy, executor: RaggedExecutor, prompts: Mapping[int, Sequence[int]],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        self.policy = policy
        self.prompts = prompts
        self.time = RealTime(clock, sleep)
        self.executor = PlanExecutor(executor, prompts)
        self.backend = TorchBackend(self.executor, self.time)

    def serve(self, requests: Sequence[Request], max_waiting: int | None = None,
              on_iteration: Callable[[BatchPlan, float, float, float], None] | None = None) -> EngineResult:
        """Serve `requests` (sorted by arrival; arrival_s in seconds from now) in real time, a lone instance.

        `on_iteration(plan, start, end, forward_s)`, if given, sees every executed plan before its bookkeeping
        (e.g. to price it with a cost model next to its measured time)."""
        self.time.start()
        return self.serve_ahead(arrivals(requests).entering, max_waiting, on_iteration)

    def serve_clients(self, requests: Sequence[Request], clients: Clients, max_waiting: int | None = None
                      ) -> EngineResult:
        """Serve `requests` as `clients` send them (closed loop, or session turns after the turn before
        them: `serving.real_clients`), a lone instance; each request's arrival_s is its send."""
        self.time.start()
        seqs = arrivals(requests).seqs
        inbox = RoutedInbox()
        sends = RealClients(clients, seqs, inbox, self.time)
        self.backend.on_release = sends.completed
        try:
            return self.run(seqs, inbox, sends.drive, max_waiting)
        finally:
            self.backend.on_release = None

    def serve_ahead(self, seqs: list[Seq], max_waiting: int | None = None,
                    on_iteration: Callable[[BatchPlan, float, float, float], None] | None = None
                    ) -> EngineResult:
        """Serve `seqs` on the started clock, each pushed ahead of its arrival: an entry instance's inbox (a
        lone engine's, or a prefill instance's)."""
        return self.run(seqs, Inbox(seqs), self.time.drive, max_waiting, on_iteration)

    def run(self, seqs: list[Seq], inbox: Inbox, drive: Callable[[Generator[float, None, None]], None],
            max_waiting: int | None = None,
            on_iteration: Callable[[BatchPlan, float, float, float], None] | None = None) -> EngineResult:
        """Serve what reaches `inbox` on the started clock, `drive` letting real time pass between the loop's
        steps (`RealTime.drive`: sleeping until known arrivals; a disaggregated decode instance: waiting for
        KV from its prefill instance). `seqs`: every request the inbox will hand over (the records')."""
        missing = [s.id for s in seqs if len(self.prompts.get(s.id, ())) != s.prompt_tokens]
        if missing:
            raise ValueError(f"requests {missing[:5]} have no prompt ids of their prompt length")
        backend = self.backend
        backend.on_iteration = on_iteration
        replica = Replica(self.policy, backend, self.time, inbox, max_waiting=max_waiting)
        with torch.inference_mode():
            drive(replica.serve())
            backend._check_counts()
        records = replica.records
        return EngineResult(
            seqs=seqs, iterations=records.iterations, gaps=records.gaps,
            queue_at_arrival=records.queue_lengths(), aborted=replica.aborted, wall_s=self.time.read(),
            tokens={s.id: self.executor.tokens(s.id) for s in seqs},
            forward_s=np.asarray(backend.forward_s, dtype=np.float64), peak_slots=self.executor.slots.peak,
        )


def generate_alone(executor: RaggedExecutor, prompt: Sequence[int], output_tokens: int, slot: int = 0
                   ) -> list[int]:
    """Greedy tokens of one request run by itself: its whole prompt in one prefill, then one decode per token
    (the reference every scheduled run must reproduce)."""
    ids = list(prompt)
    out: list[int] = []
    with torch.inference_mode():
        logits = executor.run([Segment(slot, ids, 0)])
        while True:
            tok = int(logits[0].argmax())
            out.append(tok)
            if len(out) == output_tokens:
                return out
            ids.append(tok)
            logits = executor.run([Segment(slot, [tok], len(ids) - 1)])


def warm_up(executor: RaggedExecutor, vocab_size: int, padded: bool = False, seed: int = 0) -> float:
    """A few prefills and decodes on slot 0 (thread pools, allocator, first-call dispatch, cuda kernels), and
    the executor's decode graphs captured, before the clock starts; returns the seconds it took. The slab's
    contents do not matter afterwards: a segment only reads positions its own request wrote."""
    t0 = time.perf_counter()
    n = max(1, min(64, executor.max_len - 8))
    ids = prompt_ids(2**32, n, vocab_size, seed)  # an id no trace uses
    for _ in range(3):
        executor.run([Segment(0, ids, 0)])
        for k in range(min(5, executor.max_len - n)):
            executor.run([Segment(0, [ids[0]], n + k)])
        if padded:
            segs = [Segment(i, ids[:n - i], 0) for i in range(min(2, executor.slots, n))]
            executor.run_padded(segs)
    if executor.graphs is not None:  # every decode graph the run can use, as vLLM captures before serving
        executor.graphs.capture_all()
    if executor.device.type == "cuda":
        torch.cuda.synchronize(executor.device)
    return time.perf_counter() - t0
