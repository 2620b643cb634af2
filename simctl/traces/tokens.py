"""Prompt token ids for engines that take real token ids (vLLM): deterministic, random, and shared exactly
where a trace says prompts share a prefix, so that a real prefix cache sees the sharing the simulator models
and nothing else (ids drawn at random over the vocabulary never fill a KV block identical to another
request's).

A Mooncake request (`Request.hash_ids`) is its hash blocks' ids in order, each block's drawn from a generator
seeded by (seed, hash id) only (a partial last block: its first ids), then ids of its own past the blocks the
ids cover. Mooncake's ids are chained (an id names its block and everything before it), so equal ids mean
equal tokens up to that block's end, as the twin keys them (a block by the hash id of its last token).

A session's later turn (`Request.previous`) is the session's context so far, as a chat client resends it: its
predecessor's prompt ids, then the ids the engine generated for that turn, then its own new ids. So its blocks
are a prefix of one token stream per session, which the twin's prefix cache keys as one
(`policies.prefix_kv.PrefixCachingKV._make_keys`: the shared prefix's group, then the session's stream).

    prompts = SessionPrompts(requests, vocab_size, seed)
    ids = prompts.prompt(request)               # when it is sent (a later turn: after its predecessor ended)
    prompts.generated(request.id, output_ids)   # when it completed
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simctl.traces.request import Request

_PREFIX, _OWN, _HASH = 0, 1, 2  # generator streams: a prefix group's ids, a request's own, a hash block's


def _own_ids(request_id: int, n: int, vocab_size: int, seed: int) -> list[int]:
    """A request's first `n` own ids, from a generator seeded by (seed, request id) only."""
    return np.random.default_rng([int(seed), _OWN, int(request_id)]).integers(1, vocab_size, n).tolist()


def _hashed_ids(request: Request, vocab_size: int, seed: int) -> list[int]:
    """A Mooncake request's prompt ids: its hash blocks' (each from (seed, hash id)), then its own."""
    block, ids = request.hash_block, []
    for k, h in enumerate(request.hash_ids):
        n = min(block, request.prompt_tokens - k * block)
        if n <= 0:
            break
        ids += np.random.default_rng([int(seed), _HASH, int(h)]).integers(1, vocab_size, n).tolist()
    return ids + _own_ids(request.id, request.prompt_tokens - len(ids), vocab_size, seed)


def prompt_token_ids(request: Request, vocab_size: int, seed: int = 0) -> list[int]:
    """`request.prompt_tokens` ids in [1, vocab_size): the first `prefix_tokens` the same for every request of
    its `prefix_group` (>= 0), the rest its own; a Mooncake request's (`hash_ids`) its hash blocks' then its
    own. Each part comes from a generator seeded by (seed, group), (seed, hash id) or (seed, request id) only,
    so a request has the same prompt alone and inside any trace. Id 0 is left out (a padding or special token
    in many vocabularies). RuntimeError for a request with both a prefix group and hash ids (the twin keys
    the group's blocks by the group, which the ids do not say)."""
    if request.hash_ids:
        if request.prefix_group >= 0:
            raise RuntimeError(f"request {request.id} has both a shared prefix group and Mooncake hash ids")
        return _hashed_ids(request, vocab_size, seed)
    group = request.prefix_group
    shared = min(request.prefix_tokens, request.prompt_tokens) if group >= 0 else 0
    prefix = np.random.default_rng([int(seed), _PREFIX, group]).integers(1, vocab_size, shared).tolist() \
        if shared else []
    return prefix + _own_ids(request.id, request.prompt_tokens - shared, vocab_size, seed)


def turn_token_ids(request: Request, context: Sequence[int], vocab_size: int, seed: int = 0) -> list[int]:
    """A session's later turn: `context` (its predecessor's prompt ids and the ids generated for it) followed
    by prompt_tokens - len(context) ids of its own; RuntimeError when the context is longer than the turn's
    prompt (the trace does not say what the engine saw)."""
    new = request.prompt_tokens - len(context)
    if new < 0:
        raise RuntimeError(f"request {request.id} has {request.prompt_tokens} prompt tokens, fewer than its "
                           f"session's context of {len(context)} (request {request.previous}'s prompt and "
                           "output)")
    return [*context, *_own_ids(request.id, new, vocab_size, seed)]


class SessionPrompts:
    """Every request's prompt ids, a later turn's built when it is sent from what its predecessor was sent and
    got. RuntimeError for a chain that could not be served or the twin would not see as one stream: a
    predecessor missing or after it in `requests`, in another session, or with another shared prefix (the
    twin keys the prefix's blocks by its group), or a later turn with Mooncake hash ids."""

    def __init__(self, requests: Sequence[Request], vocab_size: int, seed: int = 0) -> None:
        self.vocab_size, self.seed = vocab_size, seed
        earlier: dict[int, Request] = {}  # a turn follows one before it in the list: no cycle waits forever
        for r in requests:
            p = earlier.get(r.previous)
            earlier[r.id] = r
            if r.previous < 0:
                continue
            if p is None or p.session != r.session or r.session < 0 or r.hash_ids \
                    or (p.prefix_group, p.prefix_tokens) != (r.prefix_group, r.prefix_tokens):
                raise RuntimeError(f"request {r.id} follows request {r.previous}, which is not an earlier "
                                   "turn of the same session with the same shared prefix (and no hash ids)")
        self._followed = {r.previous for r in requests if r.previous >= 0}
        self._sent: dict[int, list[int]] = {}  # prompts of sent turns that a later turn continues
        self._context: dict[int, list[int]] = {}  # completed turns' prompt + output, until their follower

    def prompt(self, request: Request) -> list[int]:
        """The ids to send for `request`: exactly `prompt_tokens` of them (a later turn: after its
        predecessor's `generated`)."""
        if request.previous < 0:
            ids = prompt_token_ids(request, self.vocab_size, self.seed)
        else:
            ids = turn_token_ids(request, self._context.pop(request.previous), self.vocab_size, self.seed)
        if request.id in self._followed:
            self._sent[request.id] = ids
        return ids

    def generated(self, request_id: int, output_ids: Sequence[int]) -> None:
        """Request `request_id` completed with `output_ids`: its session's next turn continues them.
        RuntimeError for an id outside the vocabulary (it could not be sent back)."""
        if request_id not in self._sent:
            return
        bad = [t for t in output_ids if not 0 <= t < self.vocab_size]
        if bad:
            raise RuntimeError(f"request {request_id} generated token id {bad[0]}, outside the vocabulary of "
                               f"{self.vocab_size}")
        self._context[request_id] = [*self._sent.pop(request_id), *output_ids]
