"""Run-time state of one request inside a scheduler.

Prefill and decode are the same step here: an iteration processes `q` of the sequence's known-but-uncached
tokens; when it reaches the last known token, the model samples a new one. A fresh request knows its prompt
(P tokens, none cached); a full prefill caches P tokens and samples token 1; a decode processes that token and
samples the next. A request preempted by recompute drops its cache and must prefill prompt + generated tokens
again before it decodes.
"""

from __future__ import annotations

from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simctl.traces.request import Request


class Phase(Enum):
    WAITING = 0  # arrived, never admitted (or preempted and back in the queue)
    RUNNING = 1
    FINISHED = 2


class Seq:
    __slots__ = (
        "arrival_s", "completion_s", "computed", "first_scheduled_s", "first_token_s", "generated",
        "hash_block", "hash_ids", "id", "last_token_s", "max_gap_s", "output_tokens", "phase", "preemptions",
        "prefill_end", "prefix_group", "prefix_tokens", "priority", "prompt_tokens", "routed_overlap",
        "session",
    )

    def __init__(self, id: int, arrival_s: float, prompt_tokens: int, output_tokens: int, priority: int = 0,
                 prefix_group: int = -1, prefix_tokens: int = 0, session: int = -1,
                 hash_ids: tuple[int, ...] = (), hash_block: int = 0) -> None:
        self.id = id
        self.priority = priority  # higher runs first where a policy honours it (Baton's preemption)
        # content for prefix caching, as `simctl.traces.request.Request` defines it
        self.prefix_group = prefix_group
        self.prefix_tokens = prefix_tokens
        self.session = session
        self.hash_ids = hash_ids
        self.hash_block = hash_block
        self.arrival_s = arrival_s
        self.prompt_tokens = prompt_tokens
        self.output_tokens = output_tokens
        self.computed = 0  # tokens whose KV is cached
        self.generated = 0  # output tokens sampled so far
        self.prefill_end = prompt_tokens  # cache this many tokens before the next sample is a decode
        # the prompt tokens the router found cached on the replica it sent this request to (kv-cost, as
        # Dynamo's router): counted off its pending prefill there until it is admitted
        self.routed_overlap = 0
        self.phase = Phase.WAITING
        self.first_scheduled_s = -1.0
        self.first_token_s = -1.0
        self.last_token_s = -1.0
        self.completion_s = -1.0
        self.max_gap_s = 0.0  # the longest wait between two of its tokens (per-request TBT SLOs)
        self.preemptions = 0

    @classmethod
    def of(cls, r: Request | Seq, output_tokens: int | None = None) -> Seq:
        """The run-time state of a request that has just arrived (the one place a request becomes a `Seq`);
        `output_tokens` given: of the same request asking that many tokens (a prefill instance's copy)."""
        outputs = r.output_tokens if output_tokens is None else output_tokens
        return cls(r.id, r.arrival_s, r.prompt_tokens, outputs, r.priority, r.prefix_group, r.prefix_tokens,
                   r.session, r.hash_ids, r.hash_block)

    @property
    def known_tokens(self) -> int:
        return self.prompt_tokens + self.generated

    @property
    def in_prefill(self) -> bool:
        return self.computed < self.prefill_end

    @property
    def prefill_remaining(self) -> int:
        return self.prefill_end - self.computed

    @property
    def queued_prefill(self) -> int:
        """The prompt tokens a queue counts for it: none if it arrived with its KV; else its prefill less the
        router's overlap (nothing is computed while it waits: a preemption drops its KV, a prefix hit
        counts from admission)."""
        return self.prefill_end - self.routed_overlap if self.computed < self.prefill_end else 0

    @property
    def remaining_outputs(self) -> int:
        return self.output_tokens - self.generated

    @property
    def max_len(self) -> int:
        """Tokens whose KV is cached when the request finishes (its last sampled token is never fed back)."""
        return self.prompt_tokens + self.output_tokens - 1

    def advance(self, q: int) -> bool:
        """Cache `q` more tokens; return True when that samples a new token."""
        self.computed += q
        if self.computed == self.known_tokens:
            self.generated += 1
            return True
        return False

    def reset_for_recompute(self) -> None:
        """Preemption by recompute: the cache is dropped; prompt and outputs so far are prefilled again."""
        self.computed = self.routed_overlap = 0  # prefilled again whole, as far as a router can tell
        self.prefill_end = self.known_tokens
        self.phase = Phase.WAITING
        self.preemptions += 1

    def __repr__(self) -> str:
        return (f"Seq(id={self.id}, P={self.prompt_tokens}, O={self.output_tokens}, "
                f"computed={self.computed}, generated={self.generated}, {self.phase.name})")
