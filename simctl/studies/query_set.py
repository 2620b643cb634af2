"""Baton's query-set experiment (Cong et al., 2024, Section 5.1, Tables 1-2): every query of a fixed set is
there at time 0, and a method's result is the time to complete them all, per batch size.

The paper gives its two sets in words; here they are token lengths drawn uniformly within each word range
times TOKENS_PER_WORD (seeded), in a random order (the paper does not give its order):
- `mixed` (Target-1, Table 1; Llama-2-7B on an A6000): 120 queries, long input-short output, short
  input-long output and short input-short output in a 1:1:2 ratio. "Long" ranges around 4,000 words: here
  3,600-4,400; "short" from a few dozen to 400 words: 32-400. Long queries pass Llama-2's 4,096 positions, as
  the paper's did (its batch-4 row doubles every sequence: `scale=2`).
- `short` (Target-2, Table 2; an RTX 4090): 30 queries, input and output each a few dozen to 200 words.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.policies.registry import make_policy, max_admissible_tokens
from simctl.results.metrics import summarise_result
from simctl.sim.simulate import simulate
from simctl.traces.build import aligned
from simctl.traces.request import Request


@dataclass(frozen=True)
class QuerySet:
    size: int
    # (prompt range, output range, share of the set) per kind of query
    kinds: tuple[tuple[tuple[int, int], tuple[int, int], float], ...]
    setting: str  # the paper's model and GPU for this set

    def draw(self, seed: int, scale: float = 1.0) -> list[Request]:
        rng = np.random.default_rng(seed)
        counts = [round(share * self.size) for _, _, share in self.kinds]
        lengths = []
        for ((p0, p1), (o0, o1), _), n in zip(self.kinds, counts):
            lengths += list(zip(rng.integers(p0, p1 + 1, n), rng.integers(o0, o1 + 1, n)))
        order = rng.permutation(len(lengths))
        return [Request(i, 0.0, max(1, round(int(lengths[k][0]) * scale)),
                        max(1, round(int(lengths[k][1]) * scale)))
                for i, k in enumerate(order)]


# Llama-2's tokenizer on plain English prose: 1.49-1.54 tokens a word (GPL-3, GFDL-1.3 and a plain-words
# summary of Sarathi-Serve; research/baton_tokens_per_word.md), the ratio the paper's word counts are taken at
TOKENS_PER_WORD = 1.5


def _words(low: int, high: int) -> tuple[int, int]:
    return round(low * TOKENS_PER_WORD), round(high * TOKENS_PER_WORD)


LONG, SHORT = _words(3600, 4400), _words(32, 400)
QUERY_SETS: dict[str, QuerySet] = {
    "mixed": QuerySet(120, ((LONG, SHORT, 0.25), (SHORT, LONG, 0.25), (SHORT, SHORT, 0.5)),
                      "llama-2-7b on an a6000"),
    "short": QuerySet(30, ((_words(32, 200), _words(32, 200), 1.0),), "llama-2-7b on an rtx-4090"),
}


def query_set(name: str, seed: int = 0, scale: float = 1.0) -> list[Request]:
    try:
        return QUERY_SETS[name].draw(seed, scale)
    except KeyError:
        raise InputError(f"unknown query set {name!r}; known: {', '.join(QUERY_SETS)}") from None


def completion_time(policy: str, requests: list[Request], batch_size: int, cost: CostModel, kv_capacity: int,
                    options: Mapping[str, int] | None = None) -> dict[str, float | int]:
    """Serve the whole set with `policy` at `batch_size` (and its other settings `options`), simulated: the
    time to complete every query, and how the KV was used."""
    need = max(r.prompt_tokens + r.output_tokens for r in requests)
    max_seq_len = aligned(need)  # as for a trace file
    if need > max_admissible_tokens(policy, kv_capacity, max_seq_len):
        raise InputError(f"{policy}: a query of {need} tokens does not fit the {kv_capacity}-token KV cache")
    engine = make_policy(policy, kv_capacity, max_seq_len, {**(options or {}), "max_batch_size": batch_size})
    s = summarise_result(simulate(requests, engine, cost))
    return {"completion_s": s["makespan_s"], "kv_peak_tokens": s["kv_peak_tokens"],
            "iterations": s["iterations"]}
