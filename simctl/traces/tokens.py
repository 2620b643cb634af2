"""Prompt token ids for engines that take real token ids (vLLM): deterministic, random, and shared exactly
where a trace says prompts share a prefix, so that a real prefix cache sees the sharing the simulator models
and nothing else (ids drawn at random over the vocabulary never fill a KV block identical to another
request's).
"""

from __future__ import annotations

import numpy as np

from simctl.traces.request import Request

_PREFIX, _OWN = 0, 1  # generator streams: a prefix group's shared ids, one request's own ids


def prompt_token_ids(request: Request, vocab_size: int, seed: int = 0) -> list[int]:
    """`request.prompt_tokens` ids in [1, vocab_size): the first `prefix_tokens` the same for every request of
    its `prefix_group` (>= 0), the rest its own. Each part comes from a generator seeded by (seed, group) or
    (seed, request id) only, so a request has the same prompt alone and inside any trace. Id 0 is left out (a
    padding or special token in many vocabularies)."""
    group = request.prefix_group
    shared = min(request.prefix_tokens, request.prompt_tokens) if group >= 0 else 0
    prefix = np.random.default_rng([int(seed), _PREFIX, group]).integers(1, vocab_size, shared).tolist() \
        if shared else []
    own = np.random.default_rng([int(seed), _OWN, int(request.id)]).integers(1, vocab_size,
                                                                            request.prompt_tokens - shared)
    return prefix + own.tolist()
