"""The request record every trace produces and every layer consumes."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Request:
    id: int
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    priority: int = 0  # higher runs first where a policy honours priorities (Baton's preemption)
    # Prompt content, for prefix caching: the first `prefix_tokens` prompt tokens are identical in every
    # request of the same `prefix_group` (>= 0); every other token is unique to the request (-1: shares
    # nothing)
    prefix_group: int = -1
    prefix_tokens: int = 0
    # A conversation or agent session (>= 0; -1: none): its turns are one token stream, each turn's prompt the
    # session's context so far (its shared prefix, earlier turns' prompts and answers) plus its new tokens, so
    # a turn's blocks, its answer's included, are the next turn's prefix.
    session: int = -1
    # The turn this one follows (a request id; -1: none): it is sent `think_s` after that one completed
    # (closed loop), whatever `arrival_s` says.
    previous: int = -1
    think_s: float = 0.0
    # Prefix identities of the prompt's blocks of `hash_block` tokens, as Mooncake's traces give them
    # (`hash_ids`): two prompts with the same first k ids share their first k x hash_block tokens.
    hash_ids: tuple[int, ...] = ()
    hash_block: int = 0
