"""The KV of one padded batch tensor (Baton): every row holds the same number of columns, so the memory in use
is rows x width, whatever each row really caches (the rest are placeholders and pads)."""

from __future__ import annotations

from simctl.policies.kv import KVManager
from simctl.policies.seq import Seq


class PaddedBatchKV(KVManager):
    """`width` KV columns for each of the batch's rows. The policy sets the width (insertions widen it, a
    trim narrows it); growing a decode step widens every row by one column at once."""

    def __init__(self, capacity_tokens: int) -> None:
        self.capacity = capacity_tokens
        self.rows: set[int] = set()  # ids of the sequences holding a row
        self.width = 0

    @property
    def used(self) -> int:
        return len(self.rows) * self.width

    def fits(self, rows: int, width: int) -> bool:
        return rows * width <= self.capacity

    def can_admit(self, seq: Seq) -> bool:
        return self.fits(len(self.rows) + 1, max(self.width, seq.prefill_end))

    def admit(self, seq: Seq) -> None:
        self.rows.add(seq.id)

    def can_grow(self, seq: Seq, steps: int = 1) -> bool:
        return self.fits(len(self.rows), self.width + steps)

    def grow(self, seq: Seq, steps: int = 1) -> None:
        raise TypeError("a padded batch grows all its rows at once: use grow_common")

    def max_common_growth(self, seqs: list[Seq], limit: int) -> int:
        if not self.rows:
            return limit
        return max(0, min(limit, self.capacity // len(self.rows) - self.width))

    def grow_all(self, seqs: list[Seq], steps: int) -> None:
        self.width += steps

    def free(self, seq: Seq) -> None:
        self.rows.discard(seq.id)
        if not self.rows:
            self.width = 0
