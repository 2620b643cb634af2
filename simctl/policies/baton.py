"""Baton (Cong et al., 2024, Sections 4.1-4.3): query-level continuous batching on padded batch tensors.

The batch is one padded KV tensor of `width` columns per row (`PaddedBatchKV`: memory = rows x width). Each
row remembers where its own KV starts (the paper's `index`); the columns before it are placeholders.

- A finished query leaves its row at once (`finish`), and the next iteration gives a waiting query the free
  row.
- `baton` (vector shaping, 4.1): the newcomer's prompt is prefilled inside the batch. Every row is padded to
  the newcomer's length L, so the running rows compute L tokens for their one real token (`padded_insertion`),
  and every row's KV gains L columns: the running rows' L - 1 of them are padding, and the newcomer's own KV
  sits behind `width` placeholder columns.
- `baton-pd` (vector embedding, 4.2): newcomers are prefilled apart (a padded prefill of their own), and their
  KV is embedded end-aligned into the batch tensor (widened on the left when a newcomer is longer than the
  batch), so every batched iteration processes exactly one token per query. The paper overlaps the prefill
  with the batch's decoding ("asynchronous P&D decoupling"); by default the two take turns on the device.
  With `overlap` 1 the next waiting query is prefilled in `overlap_chunk`-token chunks beside each decode step
  (`policies.plan.concurrent`: one plan of two `streams`), then held with its KV until a row frees; the
  roofline prices such a plan, fitted models and the real engine refuse it.
- Resource releasing: before an insertion or a decode step, the columns before every row's start
  ([0 : min(index)]) are dropped.
- Batch-size scaling (4.3): when the batch KV would pass `kv_threshold` percent of the KV capacity, the newest
  queries move to host memory until it fits; they come back, ahead of any waiting query, with their KV
  embedded as soon as a row and the memory are free. A row alone is never moved out: if its padding leaves it
  no room, it is re-embedded compactly (its own KV only). Host transfers are not priced.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simctl.common.errors import InputError
from simctl.policies.base import Policy, Settings, option
from simctl.policies.kv import KVManager
from simctl.policies.padded_kv import PaddedBatchKV
from simctl.policies.plan import (
    BatchPlan,
    concurrent,
    hybrid,
    padded_decode,
    padded_insertion,
    padded_prefill,
)
from simctl.policies.seq import Phase, Seq


class Baton(Policy):
    name = "baton"
    summary = "Baton: a finished query's row goes to a waiting one, prefilled inside the padded batch"
    widening_kv = True  # padded batches whose finished rows leave at once (not `padded_batches`)

    @dataclass(frozen=True)
    class Settings(Settings):
        max_batch_size: int = option(8, "most queries in the batch (the Baton paper runs 2 to 10)")
        kv_threshold: int = option(100, "batch-size scaling: percent of the KV capacity past which the "
                                   "newest queries move to host memory (Baton, 4.3)", maximum=100)
        preempt: int = option(0, "1: preemptive scheduling (Baton, 4.3): queries are taken by priority (the "
                              "priority admission order), and one of higher priority than the lowest running "
                              "one takes that one's row when none is free (the displaced query moves to host "
                              "memory)", minimum=0, maximum=1)

        def validate(self) -> None:
            super().validate()
            if self.preempt and self.admission == "shortest":
                raise InputError("--preempt 1 takes queries by priority: it cannot take --admission shortest")

    def __init__(self, kv: PaddedBatchKV, **options: int) -> None:
        super().__init__(kv, **options)
        self.kv: PaddedBatchKV = kv
        self.start: dict[int, int] = {}  # each row's first real KV column (the paper's index)
        self.limit = kv.capacity * self.settings.kv_threshold // 100

    @property
    def admission_order(self) -> str:
        return "priority" if self.settings.preempt else self.settings.admission

    @classmethod
    def kv_manager(cls, capacity_tokens: int, max_seq_len: int) -> KVManager:
        return PaddedBatchKV(capacity_tokens)

    @classmethod
    def max_admissible_tokens(cls, kv_capacity_tokens: int, max_seq_len: int,
                              options: Mapping[str, Any] | None = None) -> int:
        return kv_capacity_tokens  # a query alone holds only its own KV

    def _room(self, rows: int) -> int:
        """KV token slots a batch of `rows` rows may hold: the threshold, but all of it for a row alone."""
        return self.kv.capacity if rows <= 1 else self.limit

    def _fits(self, rows: int, width: int) -> bool:
        return rows * width <= self._room(rows)

    # --- the batch tensor ---

    def _trim(self) -> None:
        """Resource releasing: drop the placeholder columns every row has in front."""
        if self.start:
            drop = min(self.start.values())
            if drop:
                self.kv.width -= drop
                for i in self.start:
                    self.start[i] -= drop

    def _embed(self, seqs: list[Seq], lengths: list[int]) -> None:
        """Put the sequences' KV (`lengths` columns each) into the batch end-aligned, widening the batch on
        the left for KV longer than it."""
        width = max([self.kv.width, *lengths])
        grow = width - self.kv.width
        for i in self.start:
            self.start[i] += grow
        for s, n in zip(seqs, lengths):
            self.start[s.id] = width - n
        self.kv.width = width

    def _rejoin(self) -> None:
        """Queries that have their KV (moved to host, or prefilled elsewhere) come back in order while they
        fit, embedded end-aligned."""
        queue, back = self.arrived_with_kv, []
        while queue and len(self.running) < self.max_batch_size and self._fits(
                len(self.running) + 1, max([self.kv.width, queue[0].computed, *(s.computed for s in back)])):
            back.append(queue.popleft())
            self._run(back[-1])
        self._embed(back, [s.computed for s in back])

    def _widened(self, width: int, longest: int) -> int:
        """A batch's width once newcomers of at most `longest` prompt tokens are in: every row gains them."""
        return width + longest

    def _newcomers(self) -> list[Seq]:
        """Waiting queries for the free rows, in the queue's order (by priority when preempting), while the
        widened batch fits in memory."""
        if len(self.running) >= self.max_batch_size:  # nothing to scan: no row is free
            return []
        out: list[Seq] = []
        longest = 0
        for s in self.waiting:
            rows = len(self.running) + len(out) + 1
            if rows > self.max_batch_size:
                break
            longest_next = max(longest, s.prefill_remaining)
            if not self._fits(rows, self._widened(self.kv.width, longest_next)):
                break
            out.append(s)
            longest = longest_next
        return out

    def _to_host(self, victim: Seq) -> None:
        """Move a running query's KV to host memory: it returns, embedded, ahead of any new query."""
        self.running.remove(victim)
        self.kv.free(victim)
        del self.start[victim.id]
        victim.phase = Phase.WAITING
        self.arrived_with_kv.appendleft(victim)
        self._trim()

    def _preempting(self) -> list[Seq]:
        """Preemptive scheduling: with every row taken, the highest-priority waiting query displaces the
        lowest-priority running one (the newest of those) if its priority is higher and it fits in its
        place."""
        if not self.waiting or len(self.running) < self.max_batch_size:
            return []
        best = self.waiting.head()
        victim = min(reversed(self.running), key=lambda s: s.priority)
        if best.priority <= victim.priority:
            return []
        rest = [self.start[s.id] for s in self.running if s is not victim]
        width = self.kv.width - min(rest) if rest else 0  # trimmed once the victim is gone
        if not self._fits(len(self.running), self._widened(width, best.prefill_remaining)):
            return []
        self._to_host(victim)
        return [best]

    def _scale_down(self) -> None:
        """Before a decode step widens the batch by a column: move the newest queries to host memory until it
        fits; a row alone that cannot grow is re-embedded compactly."""
        while len(self.running) > 1 and not self._fits(len(self.running), self.kv.width + 1):
            self._to_host(self.running[-1])
        if len(self.running) == 1 and not self._fits(1, self.kv.width + 1):
            (s,) = self.running
            self.kv.width, self.start[s.id] = s.computed, 0

    # --- the policy ---

    def schedule(self) -> BatchPlan | None:
        self._trim()
        self._rejoin()
        newcomers = self._preempting() if self.settings.preempt else []
        if not newcomers and not self.arrived_with_kv:  # queries moved to host come back before any new one
            newcomers = self._newcomers()
        if newcomers:
            for s in newcomers:
                self._admit(s)
            return self._insert(newcomers)
        if not self.running:
            return None
        self._scale_down()
        self.kv.width += 1
        return padded_decode(list(self.running), rows=len(self.running), kv_len=self.kv.width)

    def _insert(self, newcomers: list[Seq]) -> BatchPlan:
        """Vector shaping: the newcomers' prompts run inside the batch, every row padded to the longest."""
        plan = padded_insertion(list(self.running), self.kv.width)
        for s in newcomers:  # left-padded within the new columns: their prompts end together
            self.start[s.id] = self.kv.width + plan.row_len - s.prefill_remaining
        self.kv.width = plan.kv_len
        return plan

    def extend(self, plan: BatchPlan, limit: int) -> int:
        extra = self.repeats_allowed(plan, limit)
        self.kv.width += extra
        return extra

    def repeats_allowed(self, plan: BatchPlan, limit: int) -> int:
        """Repeat a decode step while the batch KV fits; the queue stays blocked meanwhile (no row frees, and
        the memory a newcomer would need only grows), but a query on host that fits comes back next step (a
        move to host may have trimmed the batch narrower than it was when that query left)."""
        back = self.arrived_with_kv
        if back and len(self.running) < self.max_batch_size and self._fits(
                len(self.running) + 1, max(self.kv.width, back[0].computed)):
            return 0
        return max(0, min(limit, self._room(len(self.running)) // len(self.running) - self.kv.width))

    def finish(self, seq: Seq) -> None:
        super().finish(seq)
        del self.start[seq.id]

    def release(self, seq: Seq) -> None:
        super().release(seq)
        self.start.pop(seq.id, None)


class BatonPD(Baton):
    name = "baton-pd"
    summary = "Baton with P&D decoupling: newcomers prefilled apart, their KV embedded into the batch"

    @dataclass(frozen=True)
    class Settings(Baton.Settings):
        overlap: int = option(0, "1: prefill the next waiting query while the batch decodes, on a second "
                              "stream (the paper's asynchronous P&D decoupling); 0: they take turns",
                              minimum=0, maximum=1)
        # Sarathi-Serve's (OSDI 2024) 512-token chunk: a prefill piece whose time is near a decode step's, so
        # the overlapped prefill advances beside the decode steps as an asynchronous one would
        overlap_chunk: int = option(512, "--overlap 1: prompt tokens prefilled beside each decode step")

        def validate(self) -> None:
            super().validate()
            if self.overlap and self.preempt:
                raise InputError("--overlap 1 prefills queries in queue order ahead of need: it cannot take "
                                 "--preempt 1")

    def __init__(self, kv: PaddedBatchKV, **options: int) -> None:
        super().__init__(kv, **options)
        self.prefilling: Seq | None = None  # --overlap 1: the query prefilled beside the decode steps

    @property
    def concurrent_streams(self) -> bool:
        return bool(self.settings.overlap)

    @property
    def idle(self) -> bool:
        return super().idle and self.prefilling is None

    def prefilling_apart(self) -> list[Seq]:
        return [] if self.prefilling is None else [self.prefilling]

    def schedule(self) -> BatchPlan | None:
        if not self.settings.overlap:
            return super().schedule()
        s = self.prefilling
        if s is not None and not s.in_prefill:  # its prompt is done: held with its KV until a row frees
            self.prefilling, s.phase = None, Phase.WAITING
            self.arrived_with_kv.append(s)
        plan = super().schedule()
        if plan is None:  # the batch ran out while a query was half prefilled: finish it alone
            return self._prefill_ahead()
        if not plan.decode_only:
            return plan
        prefill = self._prefill_ahead()
        return plan if prefill is None else concurrent(plan, prefill)

    def _prefill_ahead(self) -> BatchPlan | None:
        """The next chunk of the query prefilled beside the batch: the one under way, else the head of the
        queue while fewer than a batch's worth are held."""
        s = self.prefilling
        if s is None:
            if not self.waiting or len(self.arrived_with_kv) >= self.max_batch_size:
                return None
            s = self.prefilling = self.waiting.head()
            self.waiting.take(s)
            s.phase = Phase.RUNNING
        return hybrid([], [s], [min(self.settings.overlap_chunk, s.prefill_remaining)])

    def _newcomers(self) -> list[Seq]:
        if self.settings.overlap and self.running:  # they join prefilled, never stopping the batch
            return []
        return super()._newcomers()

    def finish(self, seq: Seq) -> None:
        if seq is self.prefilling:  # a one-token answer, sampled by its prefill
            self.prefilling, seq.phase = None, Phase.FINISHED
            return
        super().finish(seq)

    def release(self, seq: Seq) -> None:
        if seq is self.prefilling:
            self.prefilling, seq.phase = None, Phase.WAITING
            return
        super().release(seq)

    def _widened(self, width: int, longest: int) -> int:
        return max(width, longest)  # newcomers' KV is embedded end-aligned

    def _insert(self, newcomers: list[Seq]) -> BatchPlan:
        """Vector embedding: prefill the newcomers on their own, then embed their KV end-aligned."""
        plan = padded_prefill(newcomers, dense=True)
        # their KV joins the batch once computed; accounted from now (the prefill's own tensor is smaller)
        self._embed(newcomers, plan.num_new)
        return plan
