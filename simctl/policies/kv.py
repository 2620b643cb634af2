"""KV-cache managers. All capacities and uses are in token slots.

- `PagedKV`: vLLM's PagedAttention block manager: blocks of `block_size` slots allocated as a sequence grows,
  a watermark of free blocks kept back at admission so running sequences can grow.
- `ReservedKV`: contiguous reservation of the maximum sequence length at admission (Orca, FasterTransformer).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from simctl.policies.seq import Seq


class KVManager(ABC):
    capacity: int  # token slots

    @property
    @abstractmethod
    def used(self) -> int:
        """Token slots held (allocated or reserved) right now."""

    @abstractmethod
    def can_admit(self, seq: Seq) -> bool:
        """Whether the sequence's pending prefill (or the cache it arrived with) can be given KV now."""

    @abstractmethod
    def admit(self, seq: Seq) -> None:
        """Give the sequence KV for its whole pending prefill (or the cache it arrived with)."""

    @abstractmethod
    def can_grow(self, seq: Seq, steps: int = 1) -> bool:
        """Whether a decoding sequence can cache `steps` more tokens."""

    @abstractmethod
    def grow(self, seq: Seq, steps: int = 1) -> None:
        """Make room for `steps` more cached tokens of a decoding sequence."""

    def grow_each(self, seqs: list[Seq]) -> bool:
        """Grow every sequence by one token if all of them fit; otherwise change nothing and say so."""
        if not all(self.can_grow(s) for s in seqs):
            return False
        for s in seqs:
            self.grow(s)
        return True

    def grow_all(self, seqs: list[Seq], steps: int) -> None:
        """Make room for `steps` more cached tokens of every sequence (the caller checked it fits)."""
        for s in seqs:
            self.grow(s, steps)

    def grow_common(self, seqs: list[Seq], limit: int) -> int:
        """Grow every sequence by the largest k <= limit they can all cache (max_common_growth); return k."""
        k = self.max_common_growth(seqs, limit)
        if k > 0:
            self.grow_all(seqs, k)
        return k

    def used_while_growing(self, seqs: list[Seq], k: int) -> list[int]:
        """Token slots held during each of the next k iterations in which every sequence (grown for the first
        of them already) caches one more token, as stepping would see them: read before a stretch grows
        them all at once."""
        return [self.used] * k

    @abstractmethod
    def max_common_growth(self, seqs: list[Seq], limit: int) -> int:
        """Largest k <= limit such that every sequence can cache k more tokens at once."""

    @abstractmethod
    def free(self, seq: Seq) -> None:
        """Release everything the sequence holds."""


class PagedKV(KVManager):
    def __init__(self, capacity_tokens: int, block_size: int = 16, watermark: float = 0.01) -> None:
        self.block_size = block_size
        self.num_blocks = capacity_tokens // block_size
        self.capacity = self.num_blocks * block_size
        self.watermark_blocks = int(watermark * self.num_blocks)
        self.free_blocks = self.num_blocks
        self.held: dict[int, int] = {}  # seq id -> token slots held (its blocks x block_size)

    @property
    def used(self) -> int:
        return (self.num_blocks - self.free_blocks) * self.block_size

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    @property
    def max_request_tokens(self) -> int:
        """The longest sequence this cache can ever hold: all blocks but the watermark."""
        return (self.num_blocks - self.watermark_blocks) * self.block_size

    def can_admit(self, seq: Seq) -> bool:
        return self.free_blocks - self._blocks_for(seq.prefill_end) >= self.watermark_blocks

    def admit(self, seq: Seq) -> None:
        need = self._blocks_for(seq.prefill_end)
        assert need <= self.free_blocks, "admit() without can_admit()"
        self.free_blocks -= need
        self.held[seq.id] = need * self.block_size

    def _extra_blocks(self, seq: Seq, steps: int) -> int:
        return max(0, self._blocks_for(seq.computed + steps - self.held[seq.id]))

    def can_grow(self, seq: Seq, steps: int = 1) -> bool:
        return self._extra_blocks(seq, steps) <= self.free_blocks

    def grow(self, seq: Seq, steps: int = 1) -> None:
        extra = self._extra_blocks(seq, steps)
        assert extra <= self.free_blocks, "grow() without can_grow()"
        self.free_blocks -= extra
        self.held[seq.id] += extra * self.block_size

    def grow_each(self, seqs: list[Seq]) -> bool:
        held = self.held
        short = [s.id for s in seqs if s.computed >= held[s.id]]  # their last block is full
        if len(short) > self.free_blocks:
            return False
        bs = self.block_size
        for i in short:
            held[i] += bs
        self.free_blocks -= len(short)
        return True

    def _short(self, seqs: list[Seq], limit: int) -> list[tuple[int, int]]:
        """(id, free slots of its last block) of the sequences with fewer than `limit` such slots: the only
        ones that lack blocks to cache up to `limit` more tokens."""
        held = self.held
        return [(s.id, slack) for s in seqs if (slack := held[s.id] - s.computed) < limit]

    def _lacking(self, short: list[tuple[int, int]], k: int) -> list[int]:
        """Blocks each of these sequences lacks to cache k more tokens: ceil((k - slack) / bs) if > 0."""
        bs = self.block_size
        return [-((slack - k) // bs) if slack < k else 0 for _, slack in short]

    def _need(self, short: list[tuple[int, int]], k: int) -> int:
        """Blocks these sequences lack, all together, to cache k more tokens each."""
        return sum(self._lacking(short, k))

    def _largest_fit(self, short: list[tuple[int, int]], limit: int) -> int:
        """Largest k <= limit whose new blocks fit in the free ones (binary search; need(k) grows with k)."""
        if self._need(short, limit) <= self.free_blocks:
            return limit
        lo, hi = 0, limit  # lo fits, hi does not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._need(short, mid) <= self.free_blocks:
                lo = mid
            else:
                hi = mid
        return lo

    def _allocate(self, short: list[tuple[int, int]], k: int) -> None:
        blocks = self._lacking(short, k)
        total = sum(blocks)
        assert total <= self.free_blocks, "growth beyond the free blocks"
        self._take(short, blocks, total)

    def _take(self, short: list[tuple[int, int]], blocks: list[int], total: int) -> None:
        """Give each sequence its `blocks` (`total` of them in all)."""
        held, bs = self.held, self.block_size
        for (i, _), n in zip(short, blocks):
            held[i] += n * bs
        self.free_blocks -= total

    def grow_all(self, seqs: list[Seq], steps: int) -> None:
        self._allocate(self._short(seqs, steps), steps)

    def max_common_growth(self, seqs: list[Seq], limit: int) -> int:
        return self._largest_fit(self._short(seqs, limit), limit)

    def grow_common(self, seqs: list[Seq], limit: int) -> int:
        short = self._short(seqs, limit)  # one pass over the sequences for both the search and the growth
        blocks = self._lacking(short, limit)
        total = sum(blocks)
        if total <= self.free_blocks:  # the common case: the whole limit fits, its blocks counted once
            self._take(short, blocks, total)
            return limit
        k = self._largest_fit(short, limit)
        if k > 0:
            self._allocate(short, k)
        return k

    def used_while_growing(self, seqs: list[Seq], k: int) -> list[int]:
        bs = self.block_size
        first_needed = [0] * k  # blocks first needed at step j
        # step j caches token computed + j + 1: a sequence with `slack` free slots needs new blocks at
        # j = slack, slack + bs, ...
        for _, slack in self._short(seqs, k):
            for j in range(slack, k, bs):
                first_needed[j] += 1
        used, out = self.used, []
        for n in first_needed:
            used += n * bs
            out.append(used)
        return out

    def free(self, seq: Seq) -> None:
        self.free_blocks += self.held.pop(seq.id) // self.block_size


class ReservedKV(KVManager):
    """Each admitted sequence reserves `reserve_tokens` slots up front; growth never needs more."""

    def __init__(self, capacity_tokens: int, reserve_tokens: int) -> None:
        self.capacity = capacity_tokens
        self.reserve_tokens = reserve_tokens
        self.holders: set[int] = set()

    @property
    def used(self) -> int:
        return len(self.holders) * self.reserve_tokens

    @property
    def slots(self) -> int:
        """How many sequences fit at once."""
        return self.capacity // self.reserve_tokens

    def can_admit(self, seq: Seq) -> bool:
        return seq.id in self.holders or self.used + self.reserve_tokens <= self.capacity

    def admit(self, seq: Seq) -> None:
        assert self.can_admit(seq)
        self.holders.add(seq.id)

    def can_grow(self, seq: Seq, steps: int = 1) -> bool:
        return seq.computed + steps <= self.reserve_tokens

    def grow(self, seq: Seq, steps: int = 1) -> None:
        assert self.can_grow(seq, steps), "sequence outgrew its reservation"

    def grow_all(self, seqs: list[Seq], steps: int) -> None:
        """Nothing to take: the reservations cover it (the caller checked, as for every manager; checking
        again, a call per sequence, was a tenth of Orca's simulation time)."""

    def max_common_growth(self, seqs: list[Seq], limit: int) -> int:
        return min([limit] + [self.reserve_tokens - s.computed for s in seqs])

    def free(self, seq: Seq) -> None:
        self.holders.discard(seq.id)
