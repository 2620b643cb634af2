"""The server's request path in front of a pool's engines (`vllm serve`'s API server: the HTTP request, the
prompt's tokenization, the hand-over to the engine core): host CPU work of the deployment, not of its GPUs.

A request sent at `t` is due at the engine (schedulable) at

    done + latency_s,   done = max(t, when the server is free) + request_s + prompt_token_s x prompt tokens

The work (`FrontEnd`: per request, per prompt token) is one server process's, served first come first served
(vLLM's API server is one asyncio process; a burst queues there); `latency_s`, the cost model's measured
admission latency (`CostModel.admission_s`: the engine core's intake, measured on an idle served engine), is
pipelined. With no work a request is due `latency_s` after its send, as before the front end was modelled.
TTFT and E2E count from the send, as vLLM's benchmark client counts them. A pool has one queue in front of
all its replicas (a lone replica's server exactly; several replicas' own servers would queue less), applied
before routing, so a lone replica and a routed pool of one see the same due times. The output's way back
(detokenization, streaming) overlaps the engine's next steps in the server process and is not priced.
The terms are CPU seconds of the serving host, 0 by default (the GPU serving data is server-side); measured
on this 2-core VM with real `vllm serve` 0.32 and a 32k BPE tokenizer, about 4.4 ms a request and 5-6 us a
prompt token (research/results/front_end_vllm_serve.md). Measured on another host they carry over in the
ratio of the two hosts' single-thread speeds, as `costs.base.ScaledCost` carries a fit.
"""

from __future__ import annotations

from dataclasses import dataclass

from simctl.common.checks import is_number
from simctl.common.errors import InputError


@dataclass(frozen=True, slots=True)
class FrontEnd:
    """A server process's work per request (seconds) and per prompt token (seconds a token)."""

    request_s: float = 0.0
    prompt_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("request_s", "prompt_token_s"):
            v = getattr(self, name)
            if not (is_number(v) and 0 <= v < 1):
                flag = f"--front-end-{name.replace('_', '-')}"
                raise InputError(f"{flag} must be a number of seconds in [0, 1), got {v!r}")

    @property
    def modelled(self) -> bool:
        return bool(self.request_s or self.prompt_token_s)


NO_FRONT_END = FrontEnd()  # no work in front of the engine (a decode pool's; every run's by default)


class FrontEndQueue:
    """A pool's front end as requests pass through it, in the order they are sent."""

    __slots__ = ("_free", "latency_s", "work")

    def __init__(self, work: FrontEnd, latency_s: float) -> None:
        self.work, self.latency_s = work, latency_s
        self._free = 0.0  # when the server process has done the work of every request sent so far

    def due(self, sent_s: float, prompt_tokens: int) -> float:
        """When a request of `prompt_tokens` sent at `sent_s` (no earlier than the last one) is due."""
        w = self.work
        if not w.modelled:
            return sent_s + self.latency_s
        self._free = max(sent_s, self._free) + w.request_s + w.prompt_token_s * prompt_tokens
        return self._free + self.latency_s
