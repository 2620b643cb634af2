"""Disaggregated prefill and decode, as both the simulated cluster (`sim.cluster`) and the real engines
(`engine.disagg`) run it: a prefill instance serves a copy of each request that ends at its first token, and
the request then reaches a decode instance with its KV cached. Written once here so the two modes hand the
same state over."""

from __future__ import annotations

from policies.seq import Seq


def needs_decode_instance(seq: Seq) -> bool:
    """A request of one output token ends on its prefill instance and never crosses the link."""
    return seq.output_tokens > 1


def prefill_copy(seq: Seq) -> Seq:
    """What a prefill instance serves for `seq`: its prompt, up to its first token."""
    return Seq(seq.id, seq.arrival_s, seq.prompt_tokens, 1, seq.priority, seq.prefix_group, seq.prefix_tokens)


def arrive_with_kv(seq: Seq, copy: Seq, received_s: float) -> None:
    """`seq`'s prefill `copy` finished and its KV reached a decode instance at `received_s`: `seq` now has its
    prompt cached and token 1 sampled (`Policy.add` queues it as arrived with its KV). Its first token is
    stamped at `received_s`, when the decode side, and a user streaming from it, has it."""
    seq.first_scheduled_s, seq.preemptions = copy.first_scheduled_s, copy.preemptions
    seq.computed = seq.prompt_tokens
    seq.generated = 1
    seq.first_token_s = seq.last_token_s = received_s
