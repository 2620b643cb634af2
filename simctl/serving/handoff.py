"""A deployment's requests as run-time state, and disaggregated prefill and decode, as the simulated cluster
(`sim.cluster`), the real engines (`engine.deployment`, `engine.disagg`) and the replay of a real run
(`validation.replay`) run them: a prefill instance serves a copy of each request that ends at its first token,
and the request then reaches a decode instance with its KV cached. Written once here so the modes build and
hand over the same state."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from simctl.policies.seq import Seq

if TYPE_CHECKING:
    from simctl.traces.request import Request


@dataclass
class Arrivals:
    """What a deployment serves of a trace."""

    seqs: list[Seq]  # each request's state, in arrival order: what the records hold
    entering: list[Seq]  # what its entry pool serves: `seqs`, or (disaggregated) their prefill copies
    crossing: dict[int, Seq] = field(default_factory=dict)  # id -> a request going on to a decode instance


def arrivals(requests: Sequence[Request], disaggregated: bool = False) -> Arrivals:
    """The `Seq` of each request (`Seq.of`), and what the entry pool serves: each request itself, or, behind
    a prefill pool, its prefill copy (a request of one output token is its own: it never crosses)."""
    seqs = [Seq.of(r) for r in requests]
    if not disaggregated:
        return Arrivals(seqs, seqs)
    crossing = {s.id: s for s in seqs if needs_decode_instance(s)}
    return Arrivals(seqs, [prefill_copy(s) if s.id in crossing else s for s in seqs], crossing)


def needs_decode_instance(seq: Seq) -> bool:
    """A request of one output token ends on its prefill instance and never crosses the link."""
    return seq.output_tokens > 1


def prefill_copy(seq: Seq) -> Seq:
    """What a prefill instance serves for `seq`: its prompt, up to its first token."""
    return Seq.of(seq, output_tokens=1)


def arrive_with_kv(seq: Seq, copy: Seq, received_s: float) -> None:
    """`seq`'s prefill `copy` finished and its KV reached a decode instance at `received_s`: `seq` now has its
    prompt cached and token 1 sampled (`Policy.add` queues it as arrived with its KV). Its first token is
    stamped at `received_s`, when the decode side, and a user streaming from it, has it."""
    seq.first_scheduled_s, seq.preemptions = copy.first_scheduled_s, copy.preemptions
    seq.computed = seq.prompt_tokens
    seq.generated = 1
    seq.first_token_s = seq.last_token_s = received_s
