"""FasterTransformer: request-level batching (Sarathi-Serve, Algorithm 1).

When no batch is running, admit requests in arrival order while a slot and its KV reservation are free;
prefill them as one padded B x L batch; then decode the whole batch until its longest request finishes.
Finished requests keep their row (computed like live ones) and their KV until the batch ends, and nothing is
admitted meanwhile. Tokens still stream to the user as they are sampled.

The other request-level policies (hf-padded, length-ordered, pd: `policies/full_batching.py`; prepack) keep
this loop, a batch formed in the waiting queue's order (`_admit_batch`; length-ordered's is `shortest`), and
override where they differ: the groups its prompts are prefilled in (`_prefill_groups`: pd's similar-length
groups) and a group's layout (`_prefill`: hf-padded's dense mask, prepack's bins).
"""

from __future__ import annotations

from dataclasses import dataclass

from simctl.policies.base import Policy, Settings, option
from simctl.policies.kv import ReservedKV
from simctl.policies.plan import BatchPlan, padded_decode, padded_prefill
from simctl.policies.seq import Phase, Seq


class FasterTransformer(Policy):
    name = "faster-transformer"
    summary = "request-level batching: padded B x L prefill, decode until the whole batch finishes"
    reserves_kv = True
    padded_batches = True

    @dataclass(frozen=True)
    class Settings(Settings):
        max_batch_size: int = option(16, "most requests in a batch")

    def __init__(self, kv: ReservedKV, **options: int) -> None:
        super().__init__(kv, **options)
        self.batch: list[Seq] = []  # rows of the running batch, finished ones included
        self.groups: list[list[Seq]] = []  # the batch's prompts still to prefill
        self.kv_len = 0  # KV columns every row holds (padded to the longest prompt)

    def add(self, seq: Seq) -> None:
        if not seq.in_prefill:
            raise ValueError("FasterTransformer batches start with a padded prefill: it cannot take a "
                             "request prefilled elsewhere")
        super().add(seq)

    def _admit_batch(self) -> None:
        """Line 3: fill a new batch from the queue, in its order, while a slot and its KV are free."""
        waiting = self.waiting
        while waiting and len(self.running) < self.max_batch_size and self.kv.can_admit(waiting.head()):
            self._admit(waiting.head())

    def _prefill_groups(self, batch: list[Seq]) -> list[list[Seq]]:
        """The new batch's prompts, in the groups prefilled one iteration each: all at once here."""
        return [batch]

    def _prefill(self, batch: list[Seq]) -> BatchPlan:
        """A group's prefill: one B x L batch, pads computed (FasterTransformer's causal kernels skip the
        scores above the diagonal)."""
        return padded_prefill(batch)

    def schedule(self) -> BatchPlan | None:
        if not self.batch:  # admit only when no batch runs
            self._admit_batch()
            if not self.running:
                return None
            self.batch = list(self.running)
            self.groups = self._prefill_groups(self.batch)
            self.kv_len = 0
        if self.groups:
            plan = self._prefill(self.groups.pop(0))
            plan.batch_rows = len(self.batch)
            self.kv_len = max(self.kv_len, plan.row_len)  # every row's KV is padded to the longest prompt
            return plan
        self.kv_len += 1
        # a copy: finish() removes from self.running, and the plan must keep the rows it ran
        return padded_decode(list(self.running), rows=len(self.batch), kv_len=self.kv_len)

    def extend(self, plan: BatchPlan, limit: int) -> int:
        extra = super().extend(plan, limit)
        self.kv_len += extra
        return extra

    def finish(self, seq: Seq) -> None:
        seq.phase = Phase.FINISHED
        self.running.remove(seq)  # its row and KV stay until the batch ends
        if not self.running:
            for s in self.batch:
                self.kv.free(s)
            self.batch = []
