"""Every simulation is a cluster in simulated time: pools of replicas behind routers, and disaggregated
prefill and decode; one replica is a cluster of one, driven by the same process (`drive`).

Every replica runs the one replica loop (`simctl.serving.loop.Replica`) with its own policy, KV manager and a
`RoutedInbox`, as a SimPy process of one shared environment. Requests reach a pool at the instant they are
due (the cluster's arrivals; a KV transfer's end for a decode pool), and the pool's router chooses a replica
with what exists at that instant (`serving.routers.ReplicaView`). Those instants are URGENT SimPy events, so
at a tie they are handled before an iteration that ends at the same instant is applied, which is the order
of the single-replica loop (it applies an iteration, then takes what arrived by its end).

A replica is woken by a push when it waits for work, and a push during a stretch resumes its loop early to
cut the stretch: no replica does any work for a request routed elsewhere. An entry pool of one replica has
nothing to route: it takes every arrival ahead (`Member.take_ahead`), so its loop knows when the next request
is due and runs without a SimPy event per arrival; routing every request to one replica of several gives the
same results (tested).

Disaggregation: a prefill instance serves a copy of each request that ends at its first token; the request's
KV then crosses the shared `KVLink`, and a decode instance admits the request with its KV cached
(`Policy.add`: it decodes, and prefills again only if preempted). Its first token is stamped when the
transfer ends: that is when the decode side, and a user streaming from it, has it (DistServe stamps it at the
prefill's end; `prefill_done_s` in the requests table keeps that time). A request of one output token ends
on its prefill instance and never crosses the link.

Closed loop (`ClosedLoop`): when sends depend on completions (closed-loop clients, `--concurrency`, or
session turns sent after the turn before them), a request is sent at the instant
`serving.clients.Clients` names, an URGENT event like an open-loop arrival, its `arrival_s` set to that
instant, and routed once its front end has taken it in; every pool is routed then, a lone replica too. A
completion (a colocated replica's release; disaggregated, the decode instance's, or the prefill instance's
for a request of one output token) tells Clients when the session's next turn is ready and when the client
is free: what is due at the completion instant itself (no think time) is sent from the release, so that the
replica's next decision at that instant sees it, as it would see an open-loop arrival at that instant.

Staged (`Staged`, `run(stages=...)`): open-loop arrivals sent as a load generator sends a ladder of stages
that it drains (inference-perf's `run_stage`): a stage's requests are sent, their gaps kept, only once every
request of the stages before it has completed, plus a pause; routed as sent, a lone replica too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass
from itertools import pairwise

import simpy
from simpy.events import URGENT

from simctl.policies.base import Policy
from simctl.policies.seq import Seq
from simctl.serving.clients import Clients
from simctl.serving.front_end import NO_FRONT_END, FrontEnd, FrontEndQueue
from simctl.serving.handoff import arrivals, arrive_with_kv
from simctl.serving.inbox import Inbox
from simctl.serving.kv_link import KVLink, kv_transfer_bytes
from simctl.serving.loop import Replica
from simctl.serving.routed import HELD, RoutedInbox, RoutedTime
from simctl.serving.routers import ReplicaView, Router
from simctl.sim.replica import CostBackend, SimulatedTime
from simctl.traces.request import Request

Progress = Callable[[int, int], None]  # (requests arrived, requests in all)
# SimPy events between two progress reports (a lone replica yields every YIELD_EVERY waits)
PROGRESS_EVERY = 8
YIELD_EVERY = 1024  # at most this many waits run without handing control back to SimPy (progress reports)


class Member:
    """One replica of a pool and what its driver and router need to know about it."""

    def __init__(self, index: int, policy: Policy, backend: CostBackend, max_waiting: int | None,
                 on_release: Callable[[Member, list[Seq]], None]) -> None:
        self.index = index
        self.inbox: Inbox = RoutedInbox()
        self.admission_s = backend.admission_s  # the engine's intake: its front end's latency (front_end.py)
        self.replica = Replica(policy, backend, RoutedTime(self.inbox), self.inbox, max_waiting=max_waiting)
        self.policy = policy
        self.released = 0  # requests that left it (finished, or prefilled and handed on)
        self.wake: simpy.Event | None = None  # set while it waits for a push
        self.cutting = False  # a push has resumed it early to cut its stretch
        self.process: simpy.Process | None = None
        self.seqs: list[Seq] = []  # every request pushed here (a prefill instance's copies)
        self.shown: tuple[int, int] | None = None  # (queued, KV used) as its last step left them, if scraped
        self._latest = (0, 0)  # as the step now running will leave them
        self._on_release = on_release
        backend.on_release = self._released

    def _released(self, finished: list[Seq]) -> None:
        self.released += len(finished)
        self._on_release(self, finished)

    def take_ahead(self, seqs: list[Seq], dues: list[float]) -> None:
        """Every request it will serve, pushed at the start with when each is due (a lone entry replica:
        nothing to route). Its loop then knows when the next one is due, cuts stretches there itself, and
        never waits for a push."""
        self.inbox = self.replica.inbox = Inbox(seqs, dues)
        self.replica.clock = SimulatedTime()
        self.seqs = list(seqs)

    def view(self) -> ReplicaView:  # every replica's, at every arrival: kept to plain reads
        p, inbox = self.policy, self.inbox
        return ReplicaView(len(p.waiting) + len(p.arrived_with_kv) + inbox.pending,
                           inbox.pushed - self.released, p.kv.used)

    def step_planned(self) -> None:  # vLLM makes its stats once a step, as it ends (`update_from_output`)
        p = self.policy
        self.shown, self._latest = self._latest, (len(p.waiting) + len(p.arrived_with_kv), p.kv.used)

    def scraped_view(self) -> ReplicaView:
        """`view` as its engine's metrics show it: as its last step left it (outstanding: the router's)."""
        queued, kv_used = self.shown or (0, 0)
        return ReplicaView(queued, self.inbox.pushed - self.released, kv_used)

    def view_with_prefill(self) -> ReplicaView:
        """`view` with the prompt tokens still to prefill of every request routed here and not yet
        prefilled: queued ones (less the overlap a kv-cost router found for them, `Seq.queued_prefill`),
        counted by the inbox and the waiting queue as requests enter and leave them, and running ones (a
        batch, not a backlog)."""
        v, p = self.view(), self.policy
        v.prefill = self.inbox.prefill + p.waiting.prefill + sum(
            s.prefill_end - s.computed for s in p.running if s.computed < s.prefill_end)
        return v

    def push(self, seq: Seq, due: float) -> None:
        self.inbox.push_due(seq, due)
        self.seqs.append(seq)
        if self.wake is not None:
            if not self.wake.triggered:
                self.wake.succeed()
        elif not self.cutting and self._shortens(due):
            self.cutting = True
            self.process.interrupt()

    def _shortens(self, due: float) -> bool:
        """Whether a request due at `due` cuts the running stretch short: an iteration before its last ends at
        or after `due` (`serving.loop.Replica._cut` stops there; a cut stretch is the one checked, so a
        later push into its last iteration resumes nothing)."""
        ends = self.replica.stretch
        return ends is not None and len(ends) > 1 and due <= ends[-2]


@dataclass
class Pool:
    name: str  # "replicas" (colocated), "prefill" or "decode"
    members: list[Member]
    router: Router
    gpu: str = ""
    tp: int = 1  # GPUs per replica (its tensor-parallel group)
    # > 0: the router sees the replicas' queues and KV as scraped every `lag` s from their engines' metrics
    # (`Member.scraped_view`; kv-cost, a snapshot of its own count); their caches it reads as they are
    lag: float = 0.0
    front_end: FrontEnd = NO_FRONT_END  # the server's work in front of it (serving.front_end)
    _seen: tuple[float, Sequence[ReplicaView]] = (-math.inf, ())  # the last snapshot and its time

    def __post_init__(self) -> None:  # its replicas share a cost model, hence the engine's intake latency
        self._front = FrontEndQueue(self.front_end, self.members[0].admission_s)
        prefill = getattr(self.router, "reads_prefill", False)
        self._view = Member.view_with_prefill if prefill else Member.scraped_view if self.lag else Member.view
        for m in self.members if self._view is Member.scraped_view else ():
            m.shown = (0, 0)

    def due(self, sent_s: float, seq: Seq) -> float:
        """When a request sent to it at `sent_s` (in sending order) has passed its front end."""
        return self._front.due(sent_s, seq.prompt_tokens)

    def route(self, seq: Seq, due: float) -> None:
        if self.lag > 0.0:
            if due - self._seen[0] >= self.lag:
                self._seen = (due, self._snapshot())
            views = self._seen[1]
        else:
            views = self._snapshot()
        self.members[self.router(views, seq)].push(seq, due)

    def _snapshot(self) -> list[ReplicaView]:
        view = self._view
        return [view(m) for m in self.members]


def drive(env: simpy.Environment, member: Member, cluster: Cluster) -> Generator[simpy.Event, None, None]:
    """The member's loop as a SimPy process: each wait is a timeout, a wait for work waits for a push, and a
    push during a stretch resumes the loop early to cut it. A wait that ends strictly before the next event in
    SimPy's queue needs no SimPy event (nothing can be pushed before it ends), so the loop goes straight on: a
    lone replica makes a SimPy event only every `YIELD_EVERY` waits. Its own clock is exact either way; a tie
    with another event still goes through SimPy, which orders it."""
    gen = member.replica.serve(env.now)
    planned = member.step_planned if member.shown is not None else lambda: None
    ran, now = 0, env.now  # SimPy's time moves only while this process yields to it
    for until in gen:
        planned()
        while True:
            if until < now - 1e-9 * now:  # beyond the two clocks' rounding: a push was missed
                raise RuntimeError(f"replica {member.index} fell behind the cluster's clock")
            if until >= HELD:
                member.wake = env.event()
                yield member.wake
                member.wake, now = None, env.now
            elif until < env.peek() and ran < YIELD_EVERY:
                ran += 1
            else:
                ran = 0
                try:
                    yield env.timeout(max(until - now, 0.0))
                except simpy.Interrupt:
                    member.cutting, now = False, env.now
                    until = gen.send(True)  # the stretch's cut end, where the loop waits next
                    planned()
                    continue
                now = env.now
            break
    if member.replica.aborted:
        cluster.aborted = True


def at(env: simpy.Environment, when: float, callback: Callable[[simpy.Event], None]) -> None:
    """Run `callback` at `when`, before any process resumed at the same instant (URGENT)."""
    event = simpy.Event(env)
    event._ok, event._value = True, None  # a plain event scheduled as already triggered, like a Timeout
    event.callbacks.append(callback)
    env.schedule(event, URGENT, max(when - env.now, 0.0))


class Cluster:
    """Pools and the link between them; `run(requests)` serves every request and returns its filled-in
    `Seq`."""

    def __init__(self, env: simpy.Environment, link: KVLink | None = None,
                 kv_bytes_per_token: int = 0) -> None:
        self.env, self.link, self.kv_bytes_per_token = env, link, kv_bytes_per_token
        self.entry: Pool  # where requests arrive (the colocated replicas, or the prefill instances)
        self.decode: Pool | None = None
        self.aborted = False
        self.originals: dict[int, Seq] = {}
        self.closed: ClosedLoop | None = None  # the sends, when they depend on completions
        self.staged: Staged | None = None  # the sends, stage after drained stage

    @property
    def members(self) -> list[Member]:
        return self.entry.members + (self.decode.members if self.decode else [])

    def run(self, requests: list[Request], progress: Progress | None = None, concurrency: int | None = None,
            think_s: float = 0.0, stages: Sequence[int] | None = None, pause_s: float = 0.0) -> list[Seq]:
        """Serve `requests` (in arrival order) sent by `serving.clients.Clients(requests, concurrency,
        think_s)`, or, given each request's stage (non-decreasing; open loop only), stage after drained stage
        with `pause_s` between (`Staged`); `progress(arrived, total)` every few thousand events, if given.
        Returns each request's `Seq`, filled in (a closed loop's or a stage's `arrival_s`: when it was
        sent)."""
        env = self.env
        served = arrivals(requests, disaggregated=self.decode is not None)
        seqs, entering, self.originals = served.seqs, served.entering, served.crossing
        clients = Clients(requests, concurrency, think_s)
        if stages is not None:
            if clients.closed_loop:
                raise ValueError("stages are sent open loop: no client bound, no session turns")
            self.staged = Staged(self, seqs, entering, stages, pause_s)
        elif clients.closed_loop:  # routed as sent, a lone replica too: nobody knows the arrivals ahead
            self.closed = ClosedLoop(self, clients, seqs, entering)
        elif len(self.entry.members) == 1:
            self.entry.members[0].take_ahead(entering, [self.entry.due(s.arrival_s, s) for s in entering])
        for m in self.members:
            m.process = env.process(drive(env, m, self))
        if self.closed is not None:
            self.closed.start()
        elif self.staged is not None:
            self.staged.send_next()
        elif len(self.entry.members) > 1:
            self._arrivals = iter(entering)
            self._next_arrival()
        if progress is None:
            env.run()
            return seqs
        try:
            while True:
                for _ in range(PROGRESS_EVERY):
                    env.step()
                progress(self.arrived, len(seqs))
        except simpy.core.EmptySchedule:  # what ends env.run() too
            progress(len(seqs), len(seqs))
        return seqs

    @property
    def arrived(self) -> int:
        """Requests handed to an entry replica's policy so far."""
        return sum(len(m.replica.records.queue_at_arrival) for m in self.entry.members)

    def _next_arrival(self) -> None:
        seq = next(self._arrivals, None)
        if seq is not None and not self.aborted:
            due = self.entry.due(seq.arrival_s, seq)  # routed once its front end has taken it in
            at(self.env, due, lambda _: self._arrive(seq, due))

    def _arrive(self, seq: Seq, due: float) -> None:
        self.entry.route(seq, due)
        self._next_arrival()

    def on_release(self, member: Member, finished: list[Seq]) -> None:
        """A replica's sequences sampled their last token; a prefill instance's copies go on to the link; a
        closed loop learns of each completion."""
        if self.decode is None:
            for seq in finished:
                self._completed(seq)
            return
        for copy in finished:
            seq = self.originals.pop(copy.id, None)
            if seq is None:  # it completed: on a decode instance, or (one output token) on its prefill one
                self._completed(copy)
                continue
            ready = copy.completion_s
            end = self.link.transfer(ready, kv_transfer_bytes(self.kv_bytes_per_token, seq.prompt_tokens))
            arrive_with_kv(seq, copy, end)
            at(self.env, end, lambda _, seq=seq, end=end: self.decode.route(seq, end))

    def _completed(self, seq: Seq) -> None:
        sender = self.closed or self.staged
        if sender is not None:
            sender.completed(seq)


class ClosedLoop:
    """A run's sends when they depend on completions (see the module's docstring): `start()` schedules the
    first turns; the cluster calls `completed` for each request that completes."""

    def __init__(self, cluster: Cluster, clients: Clients, seqs: list[Seq], entering: list[Seq]) -> None:
        self.cluster, self.clients = cluster, clients
        self._seqs = {s.id: s for s in seqs}  # what the records hold
        self._entering = {s.id: s for s in entering}  # what the entry pool serves (a prefill copy, or itself)

    def start(self) -> None:
        for r in self.clients.first():
            at(self.cluster.env, r.arrival_s, lambda _, r=r: self._send(self.clients.ready(r), r.arrival_s))

    def completed(self, seq: Seq) -> None:
        now = seq.completion_s
        for when, send in self.clients.completed(seq.id, now):
            self._when(now, when, lambda send=send, when=when: self._send(send(), when))

    def _when(self, now: float, when: float, action: Callable[[], None]) -> None:
        if when == now:
            action()
        else:
            at(self.cluster.env, when, lambda _: action())

    def _send(self, request: Request | None, now: float) -> None:
        """`request` (None: nothing) is sent at `now`: timed from there, and routed when it is due."""
        cluster = self.cluster
        if request is None or cluster.aborted:
            return
        seq = self._entering[request.id]
        seq.arrival_s = self._seqs[request.id].arrival_s = now
        due = cluster.entry.due(now, seq)
        self._when(now, due, lambda: cluster.entry.route(seq, due))


class Staged:
    """Open-loop arrivals sent stage by stage (see the module's docstring), as inference-perf's load
    generator sends its stages (`inference_perf/loadgen/load_generator.py`, `run_stage`: a stage's requests,
    then a wait until all have finished, then `interval` seconds). A stage whose first arrival comes before
    the earlier stages' last completion plus `pause_s` is sent that much later, every arrival of it shifted
    by the wait; the cluster calls `completed` for each request that completes."""

    def __init__(self, cluster: Cluster, seqs: list[Seq], entering: list[Seq], stages: Sequence[int],
                 pause_s: float) -> None:
        if len(stages) != len(entering) or any(a > b for a, b in pairwise(stages)):
            raise ValueError("one stage per request, non-decreasing in arrival order")
        self.cluster, self.pause_s = cluster, pause_s
        self._sends = list(zip(seqs, entering, stages))  # (the record, what the entry pool serves, its stage)
        self._next = 0  # the next to send
        self._in_flight = 0  # sent and not completed

    def _opens_stage(self) -> bool:
        """Whether the next request to send is the first of a later stage than the last one sent."""
        n = self._next
        return 0 < n < len(self._sends) and self._sends[n][2] != self._sends[n - 1][2]

    def send_next(self) -> None:
        """Send the next request at its arrival, unless it opens a stage while requests are in flight."""
        cluster = self.cluster
        if self._next == len(self._sends) or cluster.aborted or self._in_flight and self._opens_stage():
            return  # all sent, or `completed` opens the stage
        seq = self._sends[self._next][1]
        self._next += 1
        self._in_flight += 1
        due = cluster.entry.due(seq.arrival_s, seq)
        at(cluster.env, due, lambda _: self._arrive(seq, due))

    def _arrive(self, seq: Seq, due: float) -> None:
        self.cluster.entry.route(seq, due)
        self.send_next()

    def completed(self, seq: Seq) -> None:
        self._in_flight -= 1  # completions come in time order: the last one is the stage's latest
        if self._in_flight or not self._opens_stage():
            return  # requests in flight, or the stage still sends
        _, first, stage = self._sends[self._next]
        wait = seq.completion_s + self.pause_s - first.arrival_s
        for record, entering, k in self._sends[self._next:]:
            if k != stage or wait <= 0.0:
                break
            entering.arrival_s += wait
            record.arrival_s = entering.arrival_s  # behind a prefill pool, the record keeps the send too
        self.send_next()
