"""vLLM v1's KV block pool with automatic prefix caching, as the installed vLLM 0.32 implements it
(vllm/v1/core/block_pool.py, kv_cache_manager.py, single_type_kv_cache_manager.py: FullAttentionManager).

Blocks are allocated as a request's tokens are scheduled (not for its whole prompt at admission). With
caching on, a block gets a hash once it is full of known tokens, chained on its parent: here a key naming
the block's content and place (`_key`: a shared prefix, a Mooncake block id, a session's stream, else the
request's own). A freed request's hashed blocks stay cached: free,
but found by a later request's lookup, until a new block evicts them. The free queue holds blocks without a
hash first (reused first) and then the hashed ones in the order they were freed, a request's tail block first
(`BlockPool.free_blocks`: unhashed blocks prepended, hashed ones appended; `free`: in reverse), so a new block
takes an unhashed one if there is any, else evicts the least recently freed hashed block. Several blocks may
hold the same hash (the pool does not deduplicate); a lookup takes the first cached.

Cached-free blocks count as free: `used` is the blocks requests hold. No watermark (vLLM's default 0.0).
Unlike vLLM, no block is set aside as the null block: the capacity is `capacity // block_size` blocks.
"""

from __future__ import annotations

from collections import OrderedDict

from simctl.policies.kv import KVManager, PagedKV
from simctl.policies.seq import Seq

Key = tuple[int | str, ...]


class PrefixCachingKV(PagedKV):
    """`PagedKV`'s accounting (`held`, `free_blocks`, the stretch arithmetic) over real blocks: each request's
    block table, reference counts (a cached block may be shared) and the cache of hashed blocks."""

    def __init__(self, capacity_tokens: int, block_size: int, caching: bool) -> None:
        super().__init__(capacity_tokens, block_size, watermark=0.0)
        self.caching = caching
        self.plain = list(range(self.num_blocks))  # free blocks without a hash (interchangeable)
        # free hashed blocks, first to evict first (an OrderedDict: a dict's first key is slow to find once
        # many have been deleted from its front)
        self.evictable: OrderedDict[int, None] = OrderedDict()
        self.refs = [0] * self.num_blocks
        self.key: list[Key | None] = [None] * self.num_blocks
        self.cached: dict[Key, list[int]] = {}  # hash -> the blocks holding it, first cached first
        self.tables: dict[int, list[int]] = {}  # request id -> its blocks
        self.hashed: dict[int, int] = {}  # request id -> how many of its first blocks have their hash

    def _key(self, seq: Seq, i: int) -> Key:
        """Block i's hash: its content's identity and its place. vLLM chains each block's hash on its
        parent's, so equal keys must mean equal tokens up to the block's end: a shared prefix's group, a
        Mooncake block id (itself chained: equal ids, equal prefixes), a session's stream (every turn's
        tokens, answers included, are a prefix of it), else the request's own."""
        end = (i + 1) * self.block_size
        if seq.prefix_group >= 0 and end <= seq.prefix_tokens:
            return seq.prefix_group, i
        if seq.hash_ids and end <= seq.prompt_tokens and (end - 1) // seq.hash_block < len(seq.hash_ids):
            return "h", seq.hash_ids[(end - 1) // seq.hash_block], i
        if seq.session >= 0:
            return "s", seq.session, i
        return -1 - seq.id, i

    # --- prefix lookup and admission (kv_cache_manager.get_computed_blocks, allocate_slots) ---

    def lookup(self, seq: Seq) -> list[int]:
        """The longest run of the request's first full blocks found in the cache. The last known token is
        never a hit (its logits are needed), so at most (known - 1) // block_size blocks."""
        hits: list[int] = []
        if self.caching:
            for i in range((seq.known_tokens - 1) // self.block_size):
                blocks = self.cached.get(self._key(seq, i))
                if blocks is None:
                    break
                hits.append(blocks[0])
        return hits

    def fits(self, seq: Seq, hits: list[int]) -> bool:
        """Whether the request's whole known sequence fits next to its hits (vLLM's admission gate,
        `scheduler_reserve_full_isl`, on by default); a free hit block leaves the free queue when taken."""
        taken = sum(1 for b in hits if self.refs[b] == 0)
        return self._blocks_for(seq.known_tokens) - len(hits) + taken <= self.free_blocks

    def can_admit(self, seq: Seq) -> bool:
        return self.fits(seq, self.lookup(seq))

    def admit(self, seq: Seq) -> None:
        """Give an admitted request its hit blocks and blocks for the tokens it has computed: its hits (the
        caller set `computed` to them) or the cache it arrived with. Its scheduled tokens are `allocate`d."""
        hits = self.lookup(seq)
        assert self.fits(seq, hits), "admit() without can_admit()"
        for b in hits:  # BlockPool.touch: a free hit block leaves the free queue
            if self.refs[b] == 0:
                del self.evictable[b]
                self.free_blocks -= 1
            self.refs[b] += 1
        self.tables[seq.id] = list(hits)
        self.hashed[seq.id] = len(hits)
        self.held[seq.id] = len(hits) * self.block_size
        tokens = max(seq.computed, len(hits) * self.block_size)
        self._extend(seq, tokens, min(tokens, seq.known_tokens))

    # --- growth (allocate_slots of a running request) ---

    def allocate(self, seq: Seq, tokens: int) -> bool:
        """Blocks for the running request's first `tokens` tokens, caching the full ones among those known;
        False (nothing changed) when the free blocks do not suffice."""
        if self._blocks_for(tokens) - len(self.tables[seq.id]) > self.free_blocks:
            return False
        self._extend(seq, tokens, min(tokens, seq.known_tokens))
        return True

    def grow(self, seq: Seq, steps: int = 1) -> None:
        assert self.can_grow(seq, steps), "grow() without can_grow()"
        self._extend(seq, seq.computed + steps, seq.computed + steps)

    grow_each = KVManager.grow_each  # PagedKV's shortcut counts blocks without taking them

    def grow_all(self, seqs: list[Seq], steps: int) -> None:
        for s in seqs:  # all of them: a block that fills up gets its hash even where none is added
            self._extend(s, s.computed + steps, s.computed + steps)

    grow_common = KVManager.grow_common  # through grow_all above, not PagedKV's block-counting shortcut

    def _extend(self, seq: Seq, tokens: int, cache_tokens: int) -> None:
        """Blocks up to `tokens` tokens; the hash of every block full within `cache_tokens` known tokens."""
        table = self.tables[seq.id]
        for _ in range(self._blocks_for(tokens) - len(table)):
            table.append(self._new_block())
        self.held[seq.id] = len(table) * self.block_size
        if self.caching:
            full = cache_tokens // self.block_size
            for i in range(self.hashed[seq.id], full):
                b, k = table[i], self._key(seq, i)
                self.key[b] = k
                self.cached.setdefault(k, []).append(b)
            self.hashed[seq.id] = max(full, self.hashed[seq.id])

    def _new_block(self) -> int:
        """BlockPool.get_new_blocks: an unhashed free block, else evict the first cached-free one."""
        if self.plain:
            b = self.plain.pop()
        else:
            b, _ = self.evictable.popitem(last=False)
            k = self.key[b]
            assert k is not None
            holders = self.cached[k]
            holders.remove(b)
            if not holders:
                del self.cached[k]
            self.key[b] = None
        self.refs[b] = 1
        self.free_blocks -= 1
        return b

    def free(self, seq: Seq) -> None:
        """Release the request's blocks, tail first: hashed ones stay cached (evicted in that order)."""
        del self.held[seq.id], self.hashed[seq.id]
        for b in reversed(self.tables.pop(seq.id)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_blocks += 1
                if self.key[b] is None:
                    self.plain.append(b)
                else:
                    self.evictable[b] = None
