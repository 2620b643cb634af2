"""Real execution: the simulator's replica loop (`serving.loop.Replica`) on the monotonic clock
(`serving.realtime.RealTime`), with a backend that runs each plan as ONE forward on the RaggedExecutor instead
of pricing it (`TorchBackend`): its end is the clock once the logits exist (cuda: after a synchronize), greedy
tokens are appended to each sampling sequence's ids, and the loop then applies the very bookkeeping the
simulator runs (`serving.bookkeeping`: advance Seqs, stamp times, TBT gaps, iteration row, policy.finish).

One iteration at a time (no decode stretches). An iteration's `start` is the clock read before arrivals are
drained and the policy schedules, so its logged duration covers scheduling, input preparation, the forward
and the LM head; sampling (argmax) and bookkeeping fall between iterations. Token gaps (TBT) are measured from
token stamp to token stamp and so include everything.

Plans to forwards:
- packed / hybrid plans (`Layout.PACKED`): `RaggedExecutor.run` with one `Segment` per scheduled sequence:
  its slot, its next q token ids (prompt + generated so far, from position `seq.computed`), cached =
  `seq.computed`, sampled when the segment reaches the last known token (exactly when `Seq.advance` samples).
- padded plans (`Layout.PADDED`, FasterTransformer): the padded prefill runs as a real `[B, L]` batch
  (`run_padded`, L = `plan.row_len`), pads computed; each padded decode runs all `plan.rows` rows of that
  batch, finished rows included (fed their last token at a fixed position, output discarded), over
  `plan.kv_len` KV columns per row. The LM head sees every row, as `sampled_tokens` says.

KV slots (`SlotPool`): a request takes a row of the slab when it first appears in a plan and gives it back
when it finishes (rows of a padded batch: when the whole batch has finished, as FasterTransformer keeps them);
the rows held are kept packed (the highest moves into a freed one) so decode steps read one view of the slab.
A request preempted by recompute keeps its slot and re-prefills into it from position 0 with prompt +
generated ids, so its later tokens are the ones it would have produced anyway.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from executor.ragged import RaggedExecutor, Segment
from policies.base import Policy
from policies.plan import BatchPlan, Layout
from policies.seq import Seq
from serving.inbox import Inbox
from serving.loop import Replica
from serving.realtime import RealTime
from serving.records import GapHistogram, IterationLog, request_frame
from sim.simulate import SimResult
from traces.request import Request


def prompt_ids(request_id: int, length: int, vocab_size: int, seed: int = 0) -> list[int]:
    """The prompt token ids of one request: uniform over the vocabulary, from a generator seeded by
    (seed, request id) only, so a request has the same prompt alone and inside any trace."""
    rng = np.random.default_rng([int(seed), int(request_id)])
    return rng.integers(0, vocab_size, int(length)).tolist()


class SlotPool:
    """KV-slab rows held by requests, kept packed at the bottom of the slab: a request takes row R (R = rows
    held) when first scheduled; when one finishes, the request in the highest row moves into its row
    (`move(src, dst, positions)` copies that request's KV). The running requests so always fill rows 0..R-1,
    and a decode step reads their KV as one view of the slab, as the profiler times it (`executor.ragged`):
    gathering scattered rows instead copied their whole KV every layer and made decode steps up to 1.5x
    slower than profiled (simctl issue 4)."""

    def __init__(self, slots: int, move: Callable[[int, int, int], None]) -> None:
        self.slots = slots
        self.move = move
        self.held: list[Seq] = []  # row -> the request holding it
        self.of: dict[int, int] = {}  # request id -> row
        self.peak = 0
        self.moves = 0

    def get(self, seq: Seq) -> int:
        slot = self.of.get(seq.id)
        if slot is None:
            if len(self.held) == self.slots:
                raise RuntimeError(f"no free KV slot for request {seq.id}: {len(self.held)} requests hold all "
                                   "slots (the slab has fewer slots than the policy runs requests at once)")
            slot = self.of[seq.id] = len(self.held)
            self.held.append(seq)
            self.peak = max(self.peak, len(self.held))
        return slot

    def release(self, seq: Seq) -> None:
        slot = self.of.pop(seq.id)
        last = self.held.pop()
        if last is not seq:  # fill the hole with the highest row's request
            self.held[slot] = last
            self.of[last.id] = slot
            self.move(len(self.held), slot, last.computed)
            self.moves += 1


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
        """The records in the simulator's form, for `sim.metrics.summarize` and `sim.output.write_run`."""
        return SimResult(requests=request_frame(self.seqs), iterations=self.iterations, gaps=self.gaps,
                         queue_at_arrival=self.queue_at_arrival, aborted=self.aborted, kv_capacity=kv_capacity,
                         wall_s=self.wall_s)


class TorchBackend:
    """The replica loop's backend in real mode: each plan runs as one forward on a `RaggedExecutor` (see the
    module docstring), its end stamped on the real-time clock once the logits exist; greedy tokens are
    appended to each sampling sequence's ids."""

    def __init__(self, executor: RaggedExecutor, prompts: Mapping[int, Sequence[int]], time: RealTime,
                 on_iteration: Callable[[BatchPlan, float, float, float], None] | None = None) -> None:
        self.executor = executor
        self.ids = {rid: list(p) for rid, p in prompts.items()}  # prompt + generated, per request id
        self.prompt_len = {rid: len(p) for rid, p in prompts.items()}
        self.slots = SlotPool(executor.slots, executor.move_slot)
        self.rows: list[tuple[Seq, int]] | None = None  # the running padded batch: (seq, slot) per row
        self.time = time
        self.on_iteration = on_iteration
        self.forward_s: list[float] = []
        self.samplers: list[Seq] = []  # the last iteration's sampling sequences, checked after bookkeeping
        dev = executor.device
        self.sync = (lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda" else (lambda: None)

    # ---- one plan -> one forward ------------------------------------------------------------------------
    def _segment(self, s: Seq, q: int, sample: bool | None = None) -> Segment:
        ids, c = self.ids[s.id], s.computed
        if c + q > len(ids):
            raise RuntimeError(f"request {s.id}: plan asks for tokens {c}..{c + q - 1} but only {len(ids)} "
                               "are known")
        return Segment(self.slots.get(s), ids[c:c + q], c, c + q == len(ids) if sample is None else sample)

    def execute(self, plan: BatchPlan) -> tuple[list[Seq], torch.Tensor]:
        """Run `plan` as one forward; returns the sequences that sample, in order, and their logits."""
        ex = self.executor
        if plan.layout is Layout.PACKED:
            segs = [self._segment(s, q) for s, q in zip(plan.seqs, plan.num_new)]
            logits = ex.run(segs)
            return [s for s, g in zip(plan.seqs, segs) if g.sample], logits
        if plan.layout is not Layout.PADDED:
            raise NotImplementedError(f"the real engine cannot run {plan.layout.value} plans")
        if not plan.decode_only:  # a padded B x L prefill: a new batch
            segs = [self._segment(s, q, True) for s, q in zip(plan.seqs, plan.num_new)]  # every row: LM head
            self.rows = [(s, g.slot) for s, g in zip(plan.seqs, segs)]
            logits = ex.run_padded(segs, length=plan.row_len)
            keep = [i for i, sample in enumerate(plan.sampling()) if sample]
            return [plan.seqs[i] for i in keep], logits[keep]
        # a padded decode step: every row of the batch, finished ones too
        rows = self.rows
        if rows is None or plan.rows != len(rows):
            raise RuntimeError(f"padded decode of {plan.rows} rows without a matching padded prefill")
        live = {s.id for s in plan.seqs}
        segs, keep, samplers = [], [], []
        for i, (s, slot) in enumerate(rows):
            if s.id in live:
                segs.append(self._segment(s, 1, True))
                keep.append(i)
                samplers.append(s)
            else:  # finished: its row is still computed (a fixed position below kv_len), its token discarded
                segs.append(Segment(slot, self.ids[s.id][-1:], s.computed, True))
        logits = ex.run_padded(segs, length=plan.row_len, kv_len=plan.kv_len)
        return samplers, logits[keep]

    # ---- the loop's backend protocol ----------------------------------------------------------------------
    def run(self, plan: BatchPlan, start: float) -> float:
        self._check_counts()
        t_exec = self.time.read()
        samplers, logits = self.execute(plan)
        self.sync()
        end = self.time.read()
        self.forward_s.append(end - t_exec)
        for s, tok in zip(samplers, logits.argmax(-1).tolist()):
            self.ids[s.id].append(tok)
        self.samplers = samplers
        if self.on_iteration is not None:
            self.on_iteration(plan, start, end, end - t_exec)
        return end

    def stretch_times(self, plan: BatchPlan, k: int) -> None:
        return None  # real iterations run one at a time

    def _check_counts(self) -> None:
        """The previous iteration's bookkeeping counted exactly the tokens the model produced."""
        for s in self.samplers:
            if len(self.ids[s.id]) != s.prompt_tokens + s.generated:
                raise RuntimeError(f"request {s.id}: {len(self.ids[s.id])} token ids but the policy "
                                   f"counts {s.prompt_tokens + s.generated}")

    def release(self, finished: list[Seq]) -> None:
        rows = self.rows
        in_batch = {s.id for s, _ in rows} if rows is not None else set()
        for s in finished:
            if s.id not in in_batch:
                self.slots.release(s)
        if rows is not None and all(s.completion_s >= 0 for s, _ in rows):
            for s, _ in sorted(rows, key=lambda row: -row[1]):  # highest row first: nothing moves
                self.slots.release(s)
            self.rows = None


class Engine:
    """Drives `policy` over `executor` (a `executor.ragged.RaggedExecutor`) for one list of requests, with
    the replica loop the simulator runs (`serving.loop.Replica`) on the real-time clock."""

    def __init__(self, policy: Policy, executor: RaggedExecutor, prompts: Mapping[int, Sequence[int]],
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        self.policy = policy
        self.prompts = prompts
        self.time = RealTime(clock, sleep)
        self.backend = TorchBackend(executor, prompts, self.time)

    def serve(self, requests: Sequence[Request], max_waiting: int | None = None,
              on_iteration: Callable[[BatchPlan, float, float, float], None] | None = None) -> EngineResult:
        """Serve `requests` (sorted by arrival; arrival_s in seconds from now) in real time.

        `on_iteration(plan, start, end, forward_s)`, if given, sees every executed plan before its bookkeeping
        (e.g. to price it with a cost model next to its measured time)."""
        missing = [r.id for r in requests if len(self.prompts.get(r.id, ())) != r.prompt_tokens]
        if missing:
            raise ValueError(f"requests {missing[:5]} have no prompt ids of their prompt length")
        seqs = [Seq(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests]
        backend = self.backend
        backend.on_iteration = on_iteration
        replica = Replica(self.policy, backend, self.time, Inbox(seqs), max_waiting=max_waiting)
        self.time.start()
        with torch.inference_mode():
            self.time.drive(replica.serve())
            backend._check_counts()
        records = replica.records
        return EngineResult(
            seqs=seqs, iterations=records.iterations, gaps=records.gaps,
            queue_at_arrival=records.queue_lengths(), aborted=replica.aborted, wall_s=self.time.read(),
            tokens={s.id: backend.ids[s.id][backend.prompt_len[s.id]:] for s in seqs},
            forward_s=np.asarray(backend.forward_s, dtype=np.float64), peak_slots=backend.slots.peak,
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
    """A few prefills and decodes on slot 0 (thread pools, allocator, first-call dispatch, cuda kernels)
    before the clock starts; returns the seconds it took. The slab's contents do not matter afterwards: a
    segment only reads positions its own request wrote."""
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
    if executor.device.type == "cuda":
        torch.cuda.synchronize(executor.device)
    return time.perf_counter() - t0
