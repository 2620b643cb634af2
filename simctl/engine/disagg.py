"""Real disaggregated serving on one machine: `simctl real --prefill-instances 1 --decode-instances 1`.

Two engines, each a process with its own copy of the model (same seed, same weights), KV slab, policy and
replica loop (`engine.serve.Engine`), as the simulated cluster runs them (`sim.cluster`, the hand-over of
`simctl.serving.handoff`):

- the **prefill instance** (a child process) serves a copy of every request that ends at its first token, its
  requests pushed ahead of their arrival times as a single engine's are. When a copy finishes, and before its
  slot is freed, its prompt's KV is copied into a free slot of a shared-memory hand-over buffer
  (`HANDOFF_SLOTS` slots of `[layer, 2, kv_head, position, head_dim]`, a torch tensor in shared memory) and
  the request is announced on a pipe with its first token. No free hand-over slot: the prefill instance waits
  for one (the decode side frees a slot as soon as it has copied it out, so this is back-pressure only).
- the **decode instance** (this process) admits requests whose KV has arrived and never prefills (unless it
  preempts one by recompute). A receiver thread takes each announcement the moment it comes, copies the KV
  out of the hand-over slot into private memory, frees the slot and stamps the request's first token there
  (what the simulated cluster stamps at the link transfer's end): so the transfer does not wait for the decode
  engine's iteration to end, as an asynchronous KV connector does. The decode loop takes what arrived at the
  top of each iteration (a `RoutedInbox`), and the KV goes into the request's slab slot when it is first
  scheduled (`PlanExecutor.arrive_with_kv`). The requests table's `kv_taken_s` says when the decode loop was
  handed each request (at the top of its next iteration, at or after the KV's arrival).

Both processes read the same monotonic clock and start it at the same instant, once both have warmed up. The
"link" is measured, not priced: per request, ready (the prefill's first token), start (its copy into the
buffer began) and end (the decode side has it), logged on a `KVLink` whose bandwidth is the measured
effective one (bytes over transfer time), which the simulated twin then uses. The records of both instances
are merged into the cluster's summary (`results.cluster_summary.summarise_cluster`), so a real P/D run writes
what `simctl run --prefill-instances 1 --decode-instances 1` writes.

Limits on this machine: 2 cores, one thread per instance; each instance holds the model (tiny: 20 MB) and its
own slab; the hand-over crosses shared memory, so the transfer costs copies (~GB/s) and a thread wake-up,
not a network.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.multiprocessing as mp

from simctl.common.children import STOP_GRACE_S, exit_cause
from simctl.engine.serve import Engine, EngineResult, Instance, Served
from simctl.engine.setup import RealConfig, Sizing, build_engine
from simctl.policies.seq import Seq
from simctl.serving.handoff import arrivals, arrive_with_kv
from simctl.serving.kv_link import KVLink
from simctl.serving.loop import overload_limit
from simctl.serving.routed import HELD, RoutedInbox
from simctl.traces.request import Request

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

HANDOFF_SLOTS = 8  # requests whose KV may sit in the hand-over buffer at once
START_TIMEOUT_S = 300.0  # the prefill instance's start-up (spawn, torch import, model, warm-up)


def build_instance(config: RealConfig, requests: list[Request], size: Sizing) -> tuple[Engine, float]:
    """The prefill instance's engine, built as the decode instance's (`engine.real.run_real`) is: same seed,
    same weights, same slab and policy; and its warm-up's seconds."""
    from simctl.catalogue.models import get_model
    from simctl.executor.model import build_model, resolve_device

    torch.set_num_threads(config.threads or 1)
    model = build_model(get_model(config.model), resolve_device(config.device), config.dtype,
                        config.workload.seed)
    return build_engine(config, requests, size, model)


# ---- the prefill instance (child process) ------------------------------------------------------------------


class _Sender:
    """The prefill instance's side of the hand-over: KV of finished copies into the buffer, announced on the
    pipe; freed buffer slots read back from it."""

    def __init__(self, conn: Connection, handoff: torch.Tensor, engine: Engine, needs: set[int]) -> None:
        self.conn, self.handoff, self.engine, self.needs = conn, handoff, engine, needs
        self.free = list(range(handoff.shape[0]))
        self.wait_s = 0.0  # waiting for a free hand-over slot

    def _read(self, timeout: float | None) -> None:
        """Take the decode side's messages (freed slots) for up to `timeout` seconds (None: until one
        comes)."""
        if self.conn.poll(timeout):
            while True:
                # ("free", slot); EOFError: the decode side, and this run, are gone
                _, slot = self.conn.recv()
                self.free.append(slot)
                if not self.conn.poll():
                    return

    def sleep(self, seconds: float) -> None:
        """The prefill engine's idle wait: the pipe stays read meanwhile."""
        self._read(seconds)

    def __call__(self, finished: list[Seq]) -> None:
        clock = self.engine.time
        executor = self.engine.executor
        for copy in finished:
            if copy.id not in self.needs:
                continue
            t = time.perf_counter()
            while not self.free:
                self._read(None)
            self.wait_s += time.perf_counter() - t
            slot = self.free.pop()
            start = clock.read()
            kv = executor.executor.slot_kv(executor.slots.of[copy.id], copy.computed)
            self.handoff[slot, :, :, :, :kv.shape[3]] = kv
            token = executor.tokens(copy.id)[0]
            self.conn.send(("kv", copy, token, slot, kv.shape[3], start))


def prefill_instance(config: RealConfig, size: Sizing, requests: list[Request], handoff: torch.Tensor,
                     conn: Connection) -> None:
    """The prefill instance's process: build, warm up, report ready, start at the shared instant, serve every
    request's prefill copy, send its records."""
    try:
        engine, warm_s = build_instance(config, requests, size)
        served = arrivals(requests, disaggregated=True)
        sender = _Sender(conn, handoff, engine, set(served.crossing))
        engine.backend.on_release = sender
        engine.time.sleep = sender.sleep
        conn.send(("ready", warm_s))
        _, t0 = conn.recv()  # ("start", the shared clock reading of time 0)
        engine.time.start(at=t0)
        out = engine.serve_ahead(served.entering, overload_limit([r.arrival_s for r in requests]))
        conn.send(("done", {"result": out, "warmup_s": warm_s, "handoff_wait_s": sender.wait_s,
                            "kv_used_at_end": engine.policy.kv.used}))
    except (EOFError, BrokenPipeError):
        return  # the decode side has gone: nothing to report to
    except BaseException as e:  # noqa: BLE001 - reported to the decode side, which raises it
        conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


# ---- the decode instance (this process) --------------------------------------------------------------------


@dataclass
class _Arrival:
    copy: Seq
    token: int
    kv: torch.Tensor
    start_s: float
    received_s: float


class _Receiver(threading.Thread):
    """Takes the prefill instance's announcements as they come: copies the KV out of the hand-over slot,
    frees it, stamps the arrival, and queues it for the decode loop."""

    def __init__(self, conn: Connection, handoff: torch.Tensor, engine: Engine) -> None:
        super().__init__(name="kv-receiver", daemon=True)
        self.conn, self.handoff, self.engine = conn, handoff, engine
        self.arrivals: queue.SimpleQueue[_Arrival | tuple[str, Any]] = queue.SimpleQueue()

    def run(self) -> None:
        try:
            while True:
                msg = self.conn.recv()
                if msg[0] != "kv":
                    self.arrivals.put(msg)
                    return
                _, copy, token, slot, positions, start = msg
                with torch.inference_mode():
                    kv = self.handoff[slot, :, :, :, :positions].clone()
                self.conn.send(("free", slot))
                self.arrivals.put(_Arrival(copy, token, kv, start, self.engine.time.read()))
        except (EOFError, OSError):
            self.arrivals.put(("error", "the prefill instance exited without reporting"))


class _DecodeDriver:
    """Lets real time pass for the decode loop: hands it each request whose KV has arrived, and waits for the
    next one while it has nothing to do; ends the loop once the prefill instance is done and it is idle."""

    def __init__(self, receiver: _Receiver, engine: Engine, inbox: RoutedInbox,
                 originals: dict[int, Seq]) -> None:
        self.receiver, self.engine, self.inbox, self.originals = receiver, engine, inbox, originals
        self.seqs: list[Seq] = []  # the requests the decode instance received, in order
        self.taken: dict[int, float] = {}  # request id -> when the decode loop was handed it
        self.transfers: list[tuple[float, float, float, int]] = []  # ready, start, end, positions
        self.done: dict[str, Any] | None = None

    def _take(self, item: _Arrival | tuple[str, Any]) -> None:
        if isinstance(item, tuple):
            kind, payload = item
            if kind == "error":
                raise RuntimeError(f"prefill instance failed: {payload}")
            self.done = payload
            return
        seq = self.originals[item.copy.id]
        arrive_with_kv(seq, item.copy, item.received_s)
        self.engine.executor.arrive_with_kv(seq.id, item.token, item.kv)
        # due when the loop can see it (now), not when its KV arrived: the loop reads the clock after this
        # push, so the replay of its log (`validation.replay`, from `kv_taken_s`) hands it over exactly
        # when it did
        taken = self.engine.time.read()
        self.inbox.push_due(seq, taken)
        self.taken[seq.id] = taken
        self.seqs.append(seq)
        self.transfers.append((item.copy.completion_s, item.start_s, item.received_s, item.kv.shape[3]))

    def _drain(self) -> None:
        while True:
            try:
                item = self.receiver.arrivals.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def drive(self, loop: Generator[float, None, None]) -> None:
        """The loop yields an iteration's end, which has passed when the backend returns it, or `HELD` when
        idle (a routed inbox never knows the next arrival ahead): then wait for one, or end once the prefill
        instance is done."""
        for until in loop:
            self._drain()
            if until < HELD:
                continue
            while not self.inbox.pending:
                if self.done is not None:
                    loop.close()
                    return
                self._take(self.receiver.arrivals.get())


def _start_prefill_instance(config: RealConfig, size: Sizing, requests: list[Request], handoff: torch.Tensor
                            ) -> tuple[Any, Any]:
    """The prefill instance's process, started, and this side's end of its pipe."""
    ctx = mp.get_context("spawn")
    conn, child_conn = ctx.Pipe()
    child = ctx.Process(target=prefill_instance, args=(config, size, requests, handoff, child_conn),
                        name="simctl-prefill", daemon=True)
    child.start()
    child_conn.close()
    return child, conn


def _await_ready(child: BaseProcess, conn: Connection) -> None:
    if not conn.poll(START_TIMEOUT_S):
        raise RuntimeError(f"the prefill instance did not start within {START_TIMEOUT_S:.0f} s")
    try:
        msg = conn.recv()
    except EOFError:
        child.join(STOP_GRACE_S)  # its exit status says why (SIGKILL: out of memory)
        why = exit_cause(child.exitcode) if child.exitcode is not None else "it closed its pipe"
        msg = ("error", f"{why}, while starting")
    if msg[0] != "ready":
        raise RuntimeError(f"prefill instance failed: {msg[1]}")


def serve_pair(config: RealConfig, size: Sizing, requests: list[Request], model: torch.nn.Module) -> Served:
    """Serve `requests` on a prefill instance (a child process) and a decode instance (this process, on
    `model`)."""
    from simctl.catalogue.models import get_model

    spec = get_model(config.model)
    shape = (HANDOFF_SLOTS, spec.num_layers, 2, spec.num_kv_heads, size.max_seq_len, spec.head_dim)
    handoff = torch.zeros(shape, dtype=getattr(torch, config.dtype)).share_memory_()
    child, conn = _start_prefill_instance(config, size, requests, handoff)
    try:
        engine, warm_s = build_engine(config, requests, size, model)
        _await_ready(child, conn)
        t0 = time.monotonic()
        conn.send(("start", t0))
        engine.time.start(at=t0)
        receiver = _Receiver(conn, handoff, engine)
        receiver.start()
        served = arrivals(requests, disaggregated=True)
        driver = _DecodeDriver(receiver, engine, RoutedInbox(), served.crossing)
        limit = overload_limit([r.arrival_s for r in requests])
        decoded = engine.run(served.seqs, driver.inbox, driver.drive, limit)
        while driver.done is None:  # the decode loop gave up: the prefill instance still reports
            driver._take(receiver.arrivals.get(timeout=START_TIMEOUT_S))
        receiver.join()
        child.join(timeout=10)
    finally:
        if child.is_alive():
            child.terminate()
        conn.close()
    done = driver.done
    prefilled: EngineResult = done["result"]
    # the records: a request that needed no decode instance is the prefill instance's, whole
    ends = {s.id: s for s in prefilled.seqs}
    seqs = [served.crossing.get(s.id, ends[s.id]) for s in served.seqs]
    tokens = {s.id: (decoded.tokens if s.id in served.crossing else prefilled.tokens)[s.id] for s in seqs}
    instances = [Instance("prefill", prefilled, prefilled.seqs), Instance("decode", decoded, driver.seqs)]
    fields = {
        "handoff_slots": HANDOFF_SLOTS,
        "handoff_wait_s": done["handoff_wait_s"],
        "kv_used_at_end": {"prefill": done["kv_used_at_end"], "decode": engine.policy.kv.used},
    }
    link = _measured_link(driver.transfers, spec.kv_bytes_per_token(handoff.element_size()))
    return Served(engine, max(done["warmup_s"], warm_s), instances, seqs, tokens, link,
                  {"kv_taken_s": [driver.taken.get(s.id, -1.0) for s in seqs]}, fields)


def _measured_link(transfers: list[tuple[float, float, float, int]], bytes_per_token: int) -> KVLink | None:
    """The transfers on a `KVLink` whose bandwidth is their effective one (bytes over transfer time); None
    when nothing crossed."""
    if not transfers:
        return None
    t = np.asarray(transfers, dtype=np.float64)
    took = float((t[:, 2] - t[:, 1]).sum())
    nbytes = int(t[:, 3].sum()) * bytes_per_token
    link = KVLink(nbytes * 8 / 1e9 / took if took > 0 else float(np.finfo(float).max))
    for ready, start, end, positions in transfers:
        link.record(ready, start, end, int(positions) * bytes_per_token)
    return link
