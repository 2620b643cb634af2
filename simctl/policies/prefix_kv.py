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

Speed: a long-context trace moves millions of blocks (Mooncake's conversation trace: 9 million), so blocks
move in bulk (`_take`, `free`), a request's block keys are ints made once per request (`_keys`), and a hash
maps to its first holder, later holders of the same hash kept apart (`more`).

Cached-free blocks count as free: `used` is the blocks requests hold. No watermark (vLLM's default 0.0).
Unlike vLLM, no block is set aside as the null block: the capacity is `capacity // block_size` blocks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Container, Iterable
from itertools import repeat

from simctl.policies.kv import KVManager, PagedKV
from simctl.policies.seq import Seq

Key = int  # a block's content and place (`PrefixCachingKV._make_keys`)
GROUP, HASH_ID, SESSION, OWN = range(4)  # what names a block's content: a key's kinds
# odd and above any block's place (index in its request), so that identity * _PLACES + place is one-to-one
# and distinct identities spread over a dict's low bits (which a power of two would leave to the place alone)
_PLACES = 2 ** 32 + 40_503


def content_key(kind: int, identity: int) -> int:
    """The key of the first block (place 0) of a content's kind and identity; place j's is this + j."""
    return (identity * 4 + kind) * _PLACES


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
        self.key: list[Key | None] = [None] * self.num_blocks  # a cached block's hash
        self.cached: dict[Key, int] = {}  # hash -> the first block cached with it
        self.more: dict[Key, list[int]] = {}  # hash -> the blocks cached with it after the first, in order
        self.tables: dict[int, list[int]] = {}  # request id -> its blocks
        self.hashed: dict[int, int] = {}  # request id -> how many of its first blocks have their hash
        self.keys: dict[int, list[Key]] = {}  # request id -> its first blocks' keys, made so far

    def _keys(self, seq: Seq, n: int) -> list[Key]:
        """The keys of the request's first n blocks (at least), made once for a request of this pool: every
        block it can ever fill at once (a key depends on the block's place only, not on what is generated),
        not one more per call as its decode fills blocks."""
        keys = self.keys.setdefault(seq.id, [])
        if len(keys) < n:
            keys += self._make_keys(seq, len(keys), max(n, seq.max_len // self.block_size))
        return keys

    def _make_keys(self, seq: Seq, i: int, n: int) -> list[Key]:
        """The keys of the request's blocks i to n - 1: each block's content's identity and its place. vLLM
        chains each block's hash on its parent's, so equal keys must mean equal tokens up to the block's end:
        a shared prefix's group, a Mooncake block id (itself chained: equal ids, equal prefixes), a
        session's stream (every turn's tokens, answers included, are a prefix of it), else the request's
        own. Each kind covers a run of blocks, in that order. A key is one int, `content_key(kind,
        identity)` plus the block's place: an int hashes and compares at a fraction of a tuple's cost, and a
        long-context trace makes, stores, looks up and forgets millions of them."""
        keys: list[Key] = []
        bs = self.block_size
        if seq.prefix_group >= 0:
            stop = min(n, seq.prefix_tokens // bs)
            base = content_key(GROUP, seq.prefix_group)
            keys += range(base + i, base + stop)
            i = max(i, stop)
        if seq.hash_ids:  # blocks within the prompt and the ids' reach: keyed by the id of their last token
            ids, hb = seq.hash_ids, seq.hash_block
            stop = min(n, min(seq.prompt_tokens, len(ids) * hb) // bs)
            if i < stop:
                base = [content_key(HASH_ID, h) for h in ids]
                keys += [base[((j + 1) * bs - 1) // hb] + j for j in range(i, stop)]
            i = max(i, stop)
        base = content_key(SESSION, seq.session) if seq.session >= 0 else content_key(OWN, seq.id)
        keys += range(base + i, base + n)
        return keys

    # --- prefix lookup and admission (kv_cache_manager.get_computed_blocks, allocate_slots) ---

    def block_keys(self, seq: Seq) -> list[Key]:
        """The keys of the request's first full blocks a lookup may hit, in order: the last known token is
        never a hit (its logits are needed), so (known - 1) // block_size of them. Not kept: a router asks
        for requests this pool may never see."""
        return self._make_keys(seq, 0, (seq.known_tokens - 1) // self.block_size)

    def cached_run(self, keys: Iterable[Key]) -> int:
        """How many of the first `keys` this pool caches, in a run: the blocks a lookup would hit now (a
        router's precise view of a replica's cache, the request's keys computed once for every replica)."""
        return leading(keys, self.cached)

    def cached_run_held(self, keys: Iterable[Key]) -> tuple[int, int]:
        """`cached_run`, and how many of that run's blocks requests hold now (Dynamo's router counts the
        others as blocks the request would add to the replica's active ones)."""
        cached, refs = self.cached, self.refs
        run = held = 0
        for k in keys:
            b = cached.get(k)
            if b is None:
                break
            run += 1
            held += refs[b] > 0
        return run, held

    def lookup(self, seq: Seq) -> list[int]:
        """The longest run of the request's first full blocks found in the cache (as `block_keys`)."""
        hits: list[int] = []
        if self.caching:
            n = (seq.known_tokens - 1) // self.block_size
            cached = self.cached
            for k in self._keys(seq, n)[:n]:
                b = cached.get(k)
                if b is None:
                    break
                hits.append(b)
        return hits

    def fits(self, seq: Seq, hits: list[int]) -> bool:
        """Whether the request's whole known sequence fits next to its hits (vLLM's admission gate,
        `scheduler_reserve_full_isl`, on by default); a free hit block leaves the free queue when taken."""
        refs = self.refs
        taken = sum(1 for b in hits if not refs[b])
        return self._blocks_for(seq.known_tokens) - len(hits) + taken <= self.free_blocks

    def can_admit(self, seq: Seq) -> bool:
        return self.fits(seq, self.lookup(seq))

    def admit(self, seq: Seq) -> None:
        """Give an admitted request its hit blocks and blocks for the tokens it has computed: its hits (the
        caller set `computed` to them) or the cache it arrived with. Its scheduled tokens are `allocate`d."""
        hits = self.lookup(seq)
        assert self.fits(seq, hits), "admit() without can_admit()"
        refs = self.refs
        for b in hits:  # BlockPool.touch: a free hit block leaves the free queue
            if not refs[b]:
                del self.evictable[b]
                self.free_blocks -= 1
            refs[b] += 1
        self.tables[seq.id] = list(hits)
        self.hashed[seq.id] = len(hits)
        self.held[seq.id] = len(hits) * self.block_size
        tokens = max(seq.computed, len(hits) * self.block_size)
        self._extend(seq, tokens, min(tokens, seq.known_tokens))

    def reserve(self, seq: Seq) -> None:
        """Blocks for an admitted request's whole pending prefill, none hashed yet: for a policy that sets
        them aside at admission (`simctl.policies.prefix_caching`); `allocate` hashes them as scheduled."""
        self._extend(seq, seq.prefill_end, seq.computed)

    # --- growth (allocate_slots of a running request) ---

    def allocate(self, seq: Seq, tokens: int) -> bool:
        """Blocks for the running request's first `tokens` tokens, caching the full ones among those known;
        False (nothing changed) when the free blocks do not suffice."""
        # plain arithmetic, no helpers: this runs for every scheduled request at every step
        bs, cache_tokens = self.block_size, min(tokens, seq.prompt_tokens + seq.generated)
        if tokens <= self.held[seq.id] and (not self.caching or cache_tokens // bs <= self.hashed[seq.id]):
            return True  # most decodes: within the last block, and no block newly full to hash
        if -(-tokens // bs) - len(self.tables[seq.id]) > self.free_blocks:
            return False
        self._extend(seq, tokens, cache_tokens)
        return True

    def grow(self, seq: Seq, steps: int = 1) -> None:
        assert self.can_grow(seq, steps), "grow() without can_grow()"
        self._extend(seq, seq.computed + steps, seq.computed + steps)

    def grow_each(self, seqs: list[Seq]) -> bool:
        """One more token each if the blocks they lack, all together, are free (sarathi's and vllm's
        decodes); otherwise nothing changes."""
        held = self.held
        if sum(1 for s in seqs if s.computed >= held[s.id]) > self.free_blocks:
            return False
        self.grow_all(seqs, 1)
        return True

    def grow_all(self, seqs: list[Seq], steps: int) -> None:
        held, hashed, bs, caching = self.held, self.hashed, self.block_size, self.caching
        for s in seqs:  # all of them: a block that fills up gets its hash even where none is added
            tokens = s.computed + steps
            if tokens > held[s.id] or (caching and tokens // bs > hashed[s.id]):
                self._extend(s, tokens, tokens)

    grow_common = KVManager.grow_common  # through grow_all above, not PagedKV's block-counting shortcut

    def _extend(self, seq: Seq, tokens: int, cache_tokens: int) -> None:
        """Blocks up to `tokens` tokens; the hash of every block full within `cache_tokens` known tokens."""
        table = self.tables[seq.id]
        need = -(-tokens // self.block_size) - len(table)
        if need > 0:
            table += self._take(need)
            self.held[seq.id] = len(table) * self.block_size
        if self.caching:
            full, done = cache_tokens // self.block_size, self.hashed[seq.id]
            if full > done:
                key, cached, more = self.key, self.cached, self.more
                for b, k in zip(table[done:full], self._keys(seq, full)[done:full]):
                    key[b] = k
                    if cached.setdefault(k, b) != b:
                        more.setdefault(k, []).append(b)
                self.hashed[seq.id] = full

    def _take(self, n: int) -> list[int]:
        """BlockPool.get_new_blocks: n free blocks, unhashed ones first, then the first cached-free ones
        (evicted: their hash forgotten)."""
        plain = self.plain
        got = plain[len(plain) - min(n, len(plain)):]
        del plain[len(plain) - len(got):]
        if len(got) < n:
            pop = self.evictable.popitem
            evicted = [pop(last=False)[0] for _ in range(n - len(got))]
            self._forget(evicted)
            got += evicted
        refs = self.refs
        for b in got:
            refs[b] = 1
        self.free_blocks -= n
        return got

    def _forget(self, evicted: list[int]) -> None:
        """The evicted blocks' hashes leave the cache (a block's `key` is left as it is: it is read only while
        the block is cached)."""
        key, cached, more = self.key, self.cached, self.more
        if not more:  # no hash held twice (the common case): each block is its hash's only one
            for b in evicted:
                del cached[key[b]]
            return
        for b in evicted:
            k = key[b]
            later = more.get(k)
            if later is None:
                del cached[k]
                continue
            if cached[k] == b:
                cached[k] = later.pop(0)
            else:
                later.remove(b)
            if not later:
                del more[k]

    def free(self, seq: Seq) -> None:
        """Release the request's blocks, tail first: hashed ones stay cached (evicted in that order). Its
        blocks past the hashed ones have no hash and are its own."""
        del self.held[seq.id]
        done, table = self.hashed.pop(seq.id), self.tables.pop(seq.id)
        self.keys.pop(seq.id, None)  # made again if it comes back (a preempted request)
        refs, tail = self.refs, table[done:]
        for b in tail:
            refs[b] = 0
        self.plain += tail
        released = []
        for b in reversed(table[:done]):
            refs[b] -= 1
            if not refs[b]:
                released.append(b)
        self.evictable.update(zip(released, repeat(None)))
        self.free_blocks += len(tail) + len(released)


def leading(keys: Iterable[Key], held: Container[Key]) -> int:
    """How many of the first `keys` are in `held`, in a run (a prefix match)."""
    n = 0
    for k in keys:
        if k not in held:
            break
        n += 1
    return n
