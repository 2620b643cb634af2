"""Conversations as workloads (`--trace sessions`, and session trace files): each turn resends its session's
whole context, and a later turn is sent only after the previous one's answer came back plus a think time.

A turn's prompt is its session's context plus its new tokens: turn k (from 0) of a session with system prompt
S sends S + sum over turns j < k of (new_j + answer_j) + new_k tokens (`chained_prompts`). Its `Request`
carries `session`, `previous` (the turn before it, -1 for a first turn) and `think_s`; a shared system prompt
is `prefix_group` (its index) with `prefix_tokens` S, so the prefix cache keys it apart from the session's own
stream. Requests are numbered in order of session start, then turn; a later turn's `arrival_s` is its
session's start, a lower bound only: the clients (`serving.clients`) send it `think_s` after its previous turn
completed.

The generator draws, from one seeded generator and in this order: each session's number of turns, every
turn's new-message and answer lengths, every turn's think time, each session's system prompt, and the
sessions' start times (the workload's arrival process at `--qps` sessions per second). `--num-requests`
counts turns: sessions are drawn until there are that many turns, and the last session is cut to the turns
that remain (its later turns dropped).

Distributions. LMSYS-Chat-1M (Zheng et al., "LMSYS-Chat-1M: A Large-Scale Real-World LLM Conversation
Dataset", ICLR 2024, Table 1, tokens counted with Llama 2's tokenizer) gives per conversation a mean of 2.0
turns, 69.5 tokens per user prompt and 214.5 tokens per response. Only the means are used, each as the mean
of a geometric distribution on 1, 2, ... (the maximum-entropy law for a positive integer with a given mean):
turns per session p = 1/2.0, new tokens p = 1/69.5, answer tokens p = 1/214.5. The shapes are our assumption;
the table gives no shape.

Think time: we found no published statistic of the pause between a conversation's turns (the table above has
none), so it is an explicit assumption: exponential (memoryless) with mean `--session-think-time` seconds,
default `DEFAULT_THINK_S`, a round number and not a measurement; set it for your users (0: an agent that sends
its next turn as soon as the answer is back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simctl.traces.arrivals import arrival_times
from simctl.traces.lengths import scale_lengths
from simctl.traces.request import Request
from simctl.traces.row_checks import check_arrivals, fail
from simctl.traces.session_defaults import DEFAULT_THINK_S

if TYPE_CHECKING:
    from collections.abc import Hashable
    from pathlib import Path

# A session trace file's own columns (CSV column, JSONL key; `simctl.traces.loaders`)
SESSION_ID, THINK = "session_id", "think_s"
CSV_NEW, JSON_NEW = "num_new_tokens", "new_tokens"
DESCRIPTION = ("multi-turn chats (LMSYS-Chat-1M Table 1 means: 2.0 turns, 69.5 new and 214.5 answer tokens "
               "per turn), each turn resending its context; --qps is sessions per second")


@dataclass(frozen=True, slots=True)
class ConversationStats:
    """Per-conversation means a published dataset reports."""

    turns: float
    new_tokens: float  # per user message
    answer_tokens: float  # per response


# Zheng et al., ICLR 2024, Table 1, row LMSYS-Chat-1M
LMSYS_CHAT_1M = ConversationStats(turns=2.0, new_tokens=69.5, answer_tokens=214.5)


def chained_prompts(session: np.ndarray, new: np.ndarray, output: np.ndarray,
                    context: np.ndarray) -> np.ndarray:
    """Each turn's prompt: its own `context` (a system prompt's tokens, per turn) + the new and output tokens
    of the earlier turns of its session (in array order) + its `new` tokens."""
    order = np.argsort(session, kind="stable")
    s, step = session[order], (new + output)[order]
    before = np.cumsum(step) - step  # every earlier turn's tokens, whatever their session
    first = np.ones(len(s), dtype=bool)
    first[1:] = s[1:] != s[:-1]
    start = np.maximum.accumulate(np.where(first, np.arange(len(s)), 0))
    prompts = np.empty_like(new)
    prompts[order] = before - before[start] + new[order] + context[order]
    return prompts


def previous_turns(session: np.ndarray) -> np.ndarray:
    """The request id of each turn's previous turn (-1: the session's first), requests numbered in array
    order with each session's turns contiguous."""
    previous = np.arange(-1, len(session) - 1)
    if len(session):
        previous[0] = -1
        previous[1:][session[1:] != session[:-1]] = -1
    return previous


def session_requests(starts: np.ndarray, session: np.ndarray, prompts: np.ndarray, outputs: np.ndarray,
                     think_s: np.ndarray, prefix_group: np.ndarray,
                     prefix_tokens: np.ndarray) -> list[Request]:
    """The turns as requests, ids in array order (each session's turns contiguous, sessions by start), a
    later turn arriving at its session's start (`starts`, per session)."""
    previous = previous_turns(session)
    columns = zip(starts[session].tolist(), prompts.tolist(), outputs.tolist(), prefix_group.tolist(),
                  prefix_tokens.tolist(), session.tolist(), previous.tolist(), think_s.tolist(), strict=True)
    return [Request(i, a, p, o, prefix_group=g, prefix_tokens=t, session=s, previous=b,
                    think_s=k if b >= 0 else 0.0)
            for i, (a, p, o, g, t, s, b, k) in enumerate(columns)]


def generate_sessions(n: int, qps: float | None, rng: np.random.Generator, *, arrival: str = "poisson",
                      cv: float = 1.0, scale: float = 1.0, system_prompt_tokens: int = 0,
                      system_prompts: int = 1, think_s: float = DEFAULT_THINK_S,
                      stats: ConversationStats = LMSYS_CHAT_1M) -> list[Request]:
    """`n` turns of sessions arriving at `qps` sessions per second (module docstring); lengths and the
    system prompt times `scale` (rounded half up, at least 1; a system prompt of 0 tokens stays none)."""
    turns = rng.geometric(1.0 / stats.turns, size=n)  # at most n sessions are needed
    m = int(np.searchsorted(np.cumsum(turns), n)) + 1
    turns = turns[:m]
    turns[-1] -= int(turns.sum()) - n  # the last session cut to the turns left
    session = np.repeat(np.arange(m), turns)
    new = scale_lengths(rng.geometric(1.0 / stats.new_tokens, size=n), scale)
    outputs = scale_lengths(rng.geometric(1.0 / stats.answer_tokens, size=n), scale)
    think = rng.exponential(think_s, size=n) if think_s > 0 else np.zeros(n)
    system = rng.integers(system_prompts, size=m)
    starts = arrival_times(m, qps, arrival, cv, rng)
    sys_tokens = int(scale_lengths(np.asarray([system_prompt_tokens]), scale)[0]) if system_prompt_tokens \
        else 0
    context = np.full(n, sys_tokens, dtype=np.int64)
    prompts = chained_prompts(session, new, outputs, context)
    group = system[session] if sys_tokens else np.full(n, -1, dtype=np.int64)
    return session_requests(starts, session, prompts, outputs, think, group, context)


@dataclass(frozen=True, slots=True)
class FileTurns:
    """A session file's rows as turns: `session`, `prompt_tokens` and `think_s` in file order, `starts` per
    session (None: the file gives no arrival times), and `order`, the rows in request order."""

    session: np.ndarray
    prompt_tokens: np.ndarray
    think_s: np.ndarray
    starts: np.ndarray | None
    order: np.ndarray


def file_turns(path: Path, lines: np.ndarray, labels: list[Hashable], new: np.ndarray,
               outputs: np.ndarray, think: np.ndarray, arrivals: np.ndarray | None,
               arrival_name: str) -> FileTurns:
    """The turns of a file's rows, in file order: `labels` their sessions' ids (a session numbered by its
    first row), `new` and `outputs` their lengths, `think` and `arrivals` their think time and arrival time
    (NaN where the row gives none; `arrivals` None where the file has no arrival column). A turn follows the
    row of its session above it; a session's first row gives its arrival time, a later one gives none, and
    only a later one may have a think time."""
    numbers: dict[Hashable, int] = {}
    session = np.fromiter((numbers.setdefault(label, len(numbers)) for label in labels), np.int64,
                          len(labels))
    first = np.zeros(len(session), dtype=bool)
    first[np.unique(session, return_index=True)[1]] = True
    for line, k, is_first in zip(lines.tolist(), think.tolist(), first.tolist(), strict=True):
        if not (math.isnan(k) or 0 <= k < math.inf):  # NaN: none given
            raise fail(path, line, f"{THINK} is {k}, expected a finite number of seconds >= 0")
        if is_first and k > 0:
            raise fail(path, line, f"{THINK} is {k} on the first turn of its session: a first turn is sent "
                                   "at its arrival, the think time is the pause after the previous turn")
    starts = None
    if arrivals is not None:
        for line, a, is_first, label in zip(lines.tolist(), arrivals.tolist(), first.tolist(), labels,
                                            strict=True):
            if is_first and math.isnan(a):
                raise fail(path, line, f"{arrival_name} is missing on the first turn of session {label!r}")
            if not is_first and not math.isnan(a):
                raise fail(path, line, f"{arrival_name} given on a later turn of session {label!r}: it is "
                                       f"sent {THINK} after its previous turn completed; leave it out")
        check_arrivals(path, lines[first], arrival_name, arrivals[first])
        starts = arrivals[first]
    prompts = chained_prompts(session, new, outputs, np.zeros_like(new))
    return FileTurns(session, prompts, np.nan_to_num(think, nan=0.0), starts,
                     np.argsort(session, kind="stable"))
