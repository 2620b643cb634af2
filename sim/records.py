"""Per-iteration and per-request records, kept compact: never one entry per token.

A stretch of identical decode iterations is one iteration row with a repeat count. Time-between-tokens is
kept as a weighted sample of gaps: all sequences whose previous token came at the same moment share one gap
value in an iteration, so a decode iteration of any batch size adds one or a few (gap, weight) pairs.
"""

from __future__ import annotations

from array import array

import numpy as np
import pandas as pd

from policies.seq import Seq


class IterationLog:
    def __init__(self) -> None:
        self.start = array("d")
        self.duration = array("d")  # whole row: `count` iterations back to back
        self.count = array("q")
        self.prefill_tokens = array("q")
        self.decode_tokens = array("q")
        self.batch_size = array("q")
        self.linear_tokens = array("q")
        self.kv_used = array("q")  # token slots held while the row ran

    def add(self, start: float, duration: float, count: int, prefill_tokens: int, decode_tokens: int,
            batch_size: int, linear_tokens: int, kv_used: int) -> None:
        self.start.append(start)
        self.duration.append(duration)
        self.count.append(count)
        self.prefill_tokens.append(prefill_tokens)
        self.decode_tokens.append(decode_tokens)
        self.batch_size.append(batch_size)
        self.linear_tokens.append(linear_tokens)
        self.kv_used.append(kv_used)

    @property
    def iterations(self) -> int:
        return int(sum(self.count))

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame({
            "start_s": np.frombuffer(self.start, dtype=np.float64),
            "duration_s": np.frombuffer(self.duration, dtype=np.float64),
            "count": np.frombuffer(self.count, dtype=np.int64),
            "prefill_tokens": np.frombuffer(self.prefill_tokens, dtype=np.int64),
            "decode_tokens": np.frombuffer(self.decode_tokens, dtype=np.int64),
            "batch_size": np.frombuffer(self.batch_size, dtype=np.int64),
            "linear_tokens": np.frombuffer(self.linear_tokens, dtype=np.int64),
            "kv_used_tokens": np.frombuffer(self.kv_used, dtype=np.int64),
        })


class GapSample:
    """Weighted sample of gaps between consecutive tokens of the same request."""

    def __init__(self) -> None:
        self.gap = array("d")
        self.weight = array("q")

    def add(self, gap: float, weight: int) -> None:
        self.gap.append(gap)
        self.weight.append(weight)

    def extend(self, gaps: np.ndarray, weight: int) -> None:
        self.gap.extend(gaps.tolist())
        self.weight.extend([weight] * len(gaps))

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        return np.frombuffer(self.gap, dtype=np.float64), np.frombuffer(self.weight, dtype=np.int64)


def request_frame(seqs: list[Seq]) -> pd.DataFrame:
    """One row per request; times in seconds, -1 where the event never happened (run cut short)."""
    return pd.DataFrame({
        "request_id": np.fromiter((s.id for s in seqs), np.int64, len(seqs)),
        "arrival_s": np.fromiter((s.arrival_s for s in seqs), np.float64, len(seqs)),
        "first_scheduled_s": np.fromiter((s.first_scheduled_s for s in seqs), np.float64, len(seqs)),
        "first_token_s": np.fromiter((s.first_token_s for s in seqs), np.float64, len(seqs)),
        "completion_s": np.fromiter((s.completion_s for s in seqs), np.float64, len(seqs)),
        "prompt_tokens": np.fromiter((s.prompt_tokens for s in seqs), np.int64, len(seqs)),
        "output_tokens": np.fromiter((s.output_tokens for s in seqs), np.int64, len(seqs)),
        "generated_tokens": np.fromiter((s.generated for s in seqs), np.int64, len(seqs)),
        "preemptions": np.fromiter((s.preemptions for s in seqs), np.int64, len(seqs)),
    })
