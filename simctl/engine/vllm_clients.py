"""The clients that send the real vLLM its requests, on the server's asyncio loop: when each is sent is
`serving.clients.Clients`' answer, as in the simulator (open loop: at its arrival; closed loop: when a client
is free; a session's later turn: its think time after the turn before completed), and what is sent is
`traces.tokens.SessionPrompts`' ids (a later turn resends its session's context: the earlier prompt and the
ids vLLM generated for it).

A request's `arrival_s` in the records is the instant Clients named for its send (its own arrival, a
completion plus a think time, a client freed), on the run's clock, as `vllm bench serve` times a request from
when it acquired its slot; how late the loop actually sent it is `lag` (a run's `submit_lag_max_s`). A
completion is seen when vLLM's final output reaches this process.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from simctl.engine.vllm_steps import StepLog
from simctl.executor.vllm_runtime import sampling_params
from simctl.policies.seq import Seq
from simctl.serving.clients import Clients
from simctl.traces.request import Request
from simctl.traces.tokens import SessionPrompts

if TYPE_CHECKING:  # imported only where vLLM runs
    from vllm.v1.engine.async_llm import AsyncLLM

# per request: its records, the tokens it got, the prompt tokens vLLM found cached (`num_cached_tokens`)
Done = tuple[Seq, int, int]


class VLLMClients:
    """One run's sends to `llm` (an AsyncLLM) and what came back, by request id."""

    def __init__(self, llm: AsyncLLM, log: StepLog, prompts: SessionPrompts, clients: Clients) -> None:
        self.llm, self.log, self.prompts, self.clients = llm, log, prompts, clients
        self.done: dict[int, Done] = {}
        self.lag = 0.0
        self._tasks: list[asyncio.Task[None]] = []  # held: the loop keeps only weak references to tasks
        self._total = 0
        self._finished: asyncio.Future[None] | None = None

    async def run(self, requests: list[Request]) -> list[Done]:
        """Serve `requests` (sorted by arrival) until every one completed; the first error raised in any send
        or completion."""
        self._total = len(requests)
        self._finished = asyncio.get_running_loop().create_future()
        for r in self.clients.first():
            if self._finished.done():  # a send or completion failed: no point sending more
                break
            wait = self.log.t0 + r.arrival_s - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            self._send(self.clients.ready(r), r.arrival_s)
        await self._finished
        return [self.done[r.id] for r in requests]

    def _now(self) -> float:
        return time.monotonic() - self.log.t0

    def _at(self, at: float, action: Callable[[], None]) -> None:
        """`action` at `at` on the run's clock: at once when that is not in the future (no think time), so
        that a completion's follow-ups keep Clients' order (the session's turn, then the freed client)."""
        delay = self.log.t0 + at - time.monotonic()
        if delay > 0:
            asyncio.get_running_loop().call_later(delay, action)
        else:
            action()

    def _send(self, request: Request | None, at: float) -> None:
        """Send `request` (None: Clients holds nothing to send), due at `at`."""
        if request is None or self._finished is None or self._finished.done():
            return
        try:
            ids = self.prompts.prompt(request)
        except RuntimeError as e:
            self._finished.set_exception(e)
            return
        self.lag = max(self.lag, self._now() - at)
        seq = Seq.of(request)
        seq.arrival_s = at
        self.log.open(seq)
        self._tasks.append(asyncio.ensure_future(self._one(request, ids)))

    async def _one(self, r: Request, ids: list[int]) -> None:
        assert self._finished is not None
        try:
            final = None
            async for final in self.llm.generate({"prompt_token_ids": ids}, sampling_params(r.output_tokens),
                                                 request_id=str(r.id)):
                pass
            output = list(final.outputs[0].token_ids)
            self.done[r.id] = (self.log.close(str(r.id), final.metrics), len(output), final.num_cached_tokens)
            self.prompts.generated(r.id, output)
            for at, send in self.clients.completed(r.id, self._now()):
                self._at(at, lambda send=send, at=at: self._send(send(), at))
            if len(self.done) == self._total and not self._finished.done():
                self._finished.set_result(None)
        except Exception as e:  # noqa: BLE001 - raised by run(), whichever request it came from
            if not self._finished.done():
                self._finished.set_exception(e)
