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
