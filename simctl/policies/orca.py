"""Orca: iteration-level batching with hybrid batches (Sarathi-Serve, Algorithm 2 with hybrid batches).

Every iteration, admit waiting requests in arrival order while the batch has room and KV for the maximum
sequence length can be reserved, and run their whole prefills together with one decode token of every running
request. Prefills are never chunked, so a long prompt stalls the decodes sharing its iteration.
`max_prefills` 1 is the SARATHI paper's "best-case" Orca (Section 5.2): one new request's full prefill beside
the ongoing decodes each iteration.
"""

from __future__ import annotations

from dataclasses import dataclass

from simctl.policies.base import MAX_PREFILLS_HELP, Policy, Settings, option
from simctl.policies.plan import BatchPlan, hybrid


class Orca(Policy):
    name = "orca"
    summary = "iteration-level, hybrid batches of whole prefills and decodes, KV reserved for max length"
    reserves_kv = True

    @dataclass(frozen=True)
    class Settings(Settings):
        max_batch_size: int = option(16, "most requests in a batch")
        max_prefills: int = option(0, MAX_PREFILLS_HELP, minimum=0)

    def schedule(self) -> BatchPlan | None:
        if self.arrived_with_kv:
            self._admit_arrived_with_kv()
        decodes = list(self.running)
        self.kv.grow_all(decodes, 1)  # within their reservations: never fails
        new = []
        cap = self.settings.max_prefills or self.max_batch_size
        while (self.waiting and len(self.running) < self.max_batch_size and len(new) < cap
               and self.kv.can_admit(self.waiting.head())):
            new.append(self.waiting.head())
            self._admit(new[-1])
        if not decodes and not new:
            return None
        return hybrid(decodes, new, [s.prefill_remaining for s in new])
