"""Plans to forwards: an `Executor` (serving.executor) over a `RaggedExecutor`, used by the real engine.

- packed / hybrid plans (`Layout.PACKED`): `RaggedExecutor.run` with one `Segment` per scheduled sequence:
  its slot, its next q token ids (prompt + generated so far, from position `seq.computed`), cached =
  `seq.computed`, sampled when the segment reaches the last known token (exactly when `Seq.advance` samples).
- padded plans (`Layout.PADDED`, FasterTransformer, hf-padded, pd, Baton): a padded prefill (or one group of
  it: `pd`) runs as a real `[B, L]` batch (`run_padded`, L = `plan.row_len`, under a dense mask when
  `plan.dense_attention`), pads computed. Baton's insertion is the same with the running rows' one token
  padded to L, and Baton's rows (insertion and decode) read `plan.kv_len` KV columns each: a row's own KV sits
  at its true positions in its slot and the columns past it, Baton's placeholders and pads, are read under
  the mask, so the work is the batch tensor's without moving KV (an embedding copies nothing here);
  a bin-packed prefill (`Layout.BINPACKED`, Prepacking) runs `plan.bins` as rows of L tokens
  (`run_binpacked`) and leaves each prompt's KV in its own slot, as a padded prefill would; each padded
  decode runs all `plan.rows` rows of that
  batch, finished rows included (fed their last token at a fixed position, output discarded), over
  `plan.kv_len` KV columns per row. The LM head sees every row, as `sampled_tokens` says.

KV slots (`SlotPool`): a request takes a row of the slab when it first appears in a plan and gives it back
when it finishes (rows of a padded batch: when the whole batch has finished, as FasterTransformer keeps them);
the rows held are kept packed (the highest moves into a freed one) so decode steps read one view of the slab.
A request preempted by recompute keeps its slot and re-prefills into it from position 0 with prompt +
generated ids, so its later tokens are the ones it would have produced anyway. A request prefilled by
another engine (disaggregated serving, `engine.disagg`) arrives with its first token and its prompt's KV,
which is written into the slot it takes when first scheduled (`arrive_with_kv`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch

from simctl.executor.ragged import RaggedExecutor, Segment
from simctl.policies.plan import BatchPlan, Layout
from simctl.policies.seq import Seq


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
                raise RuntimeError(f"no free KV slot for request {seq.id}: {len(self.held)} requests hold "
                                   "all slots (the slab has fewer slots than the policy runs requests at "
                                   "once)")
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


class PlanExecutor:
    """Runs each plan as one forward on a `RaggedExecutor` and samples greedily (see the module docstring).
    Holds every request's ids (prompt + generated) and the KV slots of the requests in flight."""

    def __init__(self, executor: RaggedExecutor, prompts: Mapping[int, Sequence[int]]) -> None:
        self.executor = executor
        self.ids = {rid: list(p) for rid, p in prompts.items()}  # prompt + generated, per request id
        self.prompt_len = {rid: len(p) for rid, p in prompts.items()}
        self.slots = SlotPool(executor.slots, executor.move_slot)
        # request id -> KV it arrived with, loaded into its first slot
        self.incoming: dict[int, torch.Tensor] = {}
        self.rows: list[tuple[Seq, int]] | None = None  # the running padded batch: (seq, slot) per row
        self.batch_rows = 0  # rows that batch has once all its prefill groups have run
        dev = executor.device
        self.sync: Callable[[], None] = ((lambda: torch.cuda.synchronize(dev)) if dev.type == "cuda"
                                         else (lambda: None))

    def tokens(self, seq_id: int) -> list[int]:
        """The request's generated token ids so far."""
        return self.ids[seq_id][self.prompt_len[seq_id]:]

    def arrive_with_kv(self, seq_id: int, token: int, kv: torch.Tensor) -> None:
        """A request prefilled elsewhere: its first token, and its prompt's KV (`RaggedExecutor.slot_kv`'s
        layout), which goes into the slot it takes when first scheduled."""
        self.ids[seq_id].append(token)
        self.incoming[seq_id] = kv

    def _slot(self, seq: Seq) -> int:
        slot = self.slots.get(seq)
        kv = self.incoming.pop(seq.id, None)
        if kv is not None:
            self.executor.load_slot(slot, kv)
        return slot

    def execute(self, plan: BatchPlan) -> list[tuple[Seq, int]]:
        """Run `plan` as one forward (synchronized); return the rows that sampled: (sequence, greedy
        token)."""
        samplers, logits = self._forward(plan)
        self.sync()
        sampled = list(zip(samplers, logits.argmax(-1).tolist()))
        for s, tok in sampled:
            self.ids[s.id].append(tok)
        return sampled

    def _segment(self, s: Seq, q: int, sample: bool | None = None) -> Segment:
        ids, c = self.ids[s.id], s.computed
        if c + q > len(ids):
            raise RuntimeError(f"request {s.id}: plan asks for tokens {c}..{c + q - 1} but only {len(ids)} "
                               "are known")
        return Segment(self._slot(s), ids[c:c + q], c, c + q == len(ids) if sample is None else sample)

    def _forward(self, plan: BatchPlan) -> tuple[list[Seq], torch.Tensor]:
        """The forward of `plan`: the sequences that sample, in order, and their logits."""
        ex = self.executor
        if plan.layout is Layout.PACKED:
            segs = [self._segment(s, q) for s, q in zip(plan.seqs, plan.num_new)]
            logits = ex.run(segs)
            return [s for s, g in zip(plan.seqs, segs) if g.sample], logits
        if plan.layout is Layout.BINPACKED:  # a new batch's prompts packed into rows; KV unpacked per slot
            segs = [self._segment(s, q) for s, q in zip(plan.seqs, plan.num_new)]
            self._keep_rows(plan, segs)
            logits = ex.run_binpacked([[segs[i] for i in row] for row in plan.bins], plan.row_len,
                                      dense=plan.dense_attention)
            return [plan.seqs[i] for row in plan.bins for i in row if segs[i].sample], logits
        if not plan.decode_only:  # padded B x L: a batch's prefill, or Baton's insertion into a running batch
            segs = [self._segment(s, q, True) for s, q in zip(plan.seqs, plan.num_new)]  # every row: LM head
            self._keep_rows(plan, segs)
            logits = ex.run_padded(segs, length=plan.row_len, kv_len=plan.kv_len or None,
                                   dense=plan.dense_attention)
            keep = [i for i, sample in enumerate(plan.sampling()) if sample]
            return [plan.seqs[i] for i in keep], logits[keep]
        if self.rows is None:  # a padded decode step of a batch without finished rows (Baton)
            segs = [self._segment(s, 1, True) for s in plan.seqs]
            return list(plan.seqs), ex.run_padded(segs, length=1, kv_len=plan.kv_len)
        # a padded decode step of a request-level batch: every row, finished ones too
        rows = self.rows
        if plan.rows != len(rows):
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

    def _keep_rows(self, plan: BatchPlan, segs: list[Segment]) -> None:
        """A request-level batch's prefill (a group of it): its rows stay until the whole batch finishes."""
        if plan.batch_rows:
            self.rows = (self.rows or []) + [(s, g.slot) for s, g in zip(plan.seqs, segs)]
            self.batch_rows = plan.batch_rows

    def release(self, finished: list[Seq]) -> None:
        """Give back the KV slots of finished requests (a padded batch's, once all its rows have finished)."""
        rows = self.rows
        in_batch = {s.id for s, _ in rows} if rows is not None else set()
        for s in finished:
            if s.id not in in_batch:
                self.slots.release(s)
        # the batch ends once all its rows are in (`pd` prefills it in groups) and all have finished
        if rows is not None and len(rows) == self.batch_rows and all(s.completion_s >= 0 for s, _ in rows):
            for s, _ in sorted(rows, key=lambda row: -row[1]):  # highest row first: nothing moves
                self.slots.release(s)
            self.rows = None
