"""Requests longer than the server's max model length, handled as a server does: refused and counted (vLLM
answers such a request with an error and serves the rest), an error for the whole run (simctl's behaviour
before), or the prompt truncated to fit (vLLM's truncate_prompt_tokens)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from simctl.common.errors import InputError
from simctl.traces.request import Request

REFUSE, ERROR, TRUNCATE = "refuse", "error", "truncate"
ON_TOO_LONG = (REFUSE, ERROR, TRUNCATE)


def check_on_too_long(mode: str) -> None:
    if mode not in ON_TOO_LONG:
        raise InputError(f"--on-too-long {mode!r}: choose {', '.join(ON_TOO_LONG)}")


@dataclass(frozen=True)
class Screened:
    """The requests a server with `max_len` positions serves, and what happened to the others."""

    requests: list[Request]  # served, in arrival order (truncated ones shortened)
    refused: int = 0
    truncated: int = 0
    longest: int = 0  # positions (prompt + output) the longest request that did not fit needed; 0: all fit

    def note(self, max_len: int) -> str | None:
        """The warning a user sees, or None when every request fit."""
        if not self.longest:
            return None
        done = (f"{self.refused} refused" if self.refused else "") + (
            f"{', ' if self.refused else ''}{self.truncated} prompts truncated" if self.truncated else "")
        total = len(self.requests) + self.refused
        return (f"{self.refused + self.truncated} of {total} requests exceed the max model length, {max_len} "
                f"(the longest needs {self.longest} positions): {done}")


def too_long_error(r: Request, max_len: int, limit: str) -> InputError:
    need = r.prompt_tokens + r.output_tokens
    return InputError(f"request {r.id} needs {need} positions ({r.prompt_tokens} prompt + {r.output_tokens} "
                      f"output) but {limit}; refuse such requests "
                      "(--on-too-long refuse), truncate their prompts, or raise --max-model-len")


def screen(requests: list[Request], max_len: int, mode: str, limit: str = "") -> Screened:
    """Apply `mode` to the requests needing more than `max_len` positions. `limit` words the error
    (`mode` error): what `max_len` is, e.g. "llama-2-7b has a context of 4096"."""
    check_on_too_long(mode)
    long = [r for r in requests if r.prompt_tokens + r.output_tokens > max_len]
    if not long:
        return Screened(requests)
    longest = max(long, key=lambda r: r.prompt_tokens + r.output_tokens)
    if mode == ERROR:
        raise too_long_error(longest, max_len, limit or f"--max-model-len is {max_len}")
    kept: list[Request] = []
    refused = truncated = 0
    for r in requests:
        if r.prompt_tokens + r.output_tokens <= max_len:
            kept.append(r)
        elif mode == TRUNCATE and r.output_tokens < max_len:  # at least one prompt token stays
            kept.append(replace(r, prompt_tokens=max_len - r.output_tokens,
                                prefix_tokens=min(r.prefix_tokens, max_len - r.output_tokens)))
            truncated += 1
        else:  # refused, or an output alone longer than the context (no prompt is short enough)
            refused += 1
    if not kept:
        raise InputError(f"every request exceeds --max-model-len {max_len} (the longest needs "
                         f"{longest.prompt_tokens + longest.output_tokens} positions): nothing to serve")
    return Screened(kept, refused, truncated, longest.prompt_tokens + longest.output_tokens)
