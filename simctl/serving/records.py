"""Per-iteration and per-request records, kept compact: never one entry per token.

A stretch of identical decode iterations is one iteration row with a repeat count. Time-between-tokens goes
into a fixed log-spaced histogram (relative resolution 1e-4): a run's memory does not grow with its tokens or
its iterations (FasterTransformer runs tens of millions of them at 100k requests).
"""

from __future__ import annotations

from array import array
from dataclasses import dataclass, field
from math import log10
from typing import TYPE_CHECKING

import numpy as np

from simctl.policies.seq import Seq

if TYPE_CHECKING:
    from collections.abc import Mapping

    import pandas as pd

    # a requests table as the SLO and goodput checks read it: its columns by name, or their frame
    RequestTable = Mapping[str, np.ndarray] | pd.DataFrame


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

    def add_each(self, starts: list[float], ends: list[float], kv_used: list[int], prefill_tokens: int,
                 decode_tokens: int, batch_size: int, linear_tokens: int) -> None:
        """`add` of one iteration from each start to its end, holding its `kv_used`, as a few array extends
        (a stretch of prompt chunks is recorded one row per iteration)."""
        n = len(ends)
        if not len(starts) == len(kv_used) == n:
            raise ValueError("one start, end and KV figure per row")
        self.start.extend(starts)
        self.duration.extend([b - a for a, b in zip(starts, ends)])
        self.count.extend([1] * n)
        self.prefill_tokens.extend([prefill_tokens] * n)
        self.decode_tokens.extend([decode_tokens] * n)
        self.batch_size.extend([batch_size] * n)
        self.linear_tokens.extend([linear_tokens] * n)
        self.kv_used.extend(kv_used)

    @property
    def iterations(self) -> int:
        return int(sum(self.count))

    def frame(self) -> pd.DataFrame:
        import pandas as pd  # only where a table is asked for: a run's summary reads the arrays

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


class GapHistogram:
    """Counts of gaps between consecutive tokens of the same request, in log-spaced bins.

    20,000 bins per decade from 1e-7 s to 1e5 s (240,000 counters): a percentile read off it is the bin's
    geometric centre, within 0.006% of the exact value.
    """

    PER_DECADE = 20_000
    LOW_EXP, HIGH_EXP = -7, 5
    LOWEST = 10.0 ** LOW_EXP  # gaps below it count in the first bin

    def __init__(self) -> None:
        self._counts = np.zeros((self.HIGH_EXP - self.LOW_EXP) * self.PER_DECADE, dtype=np.int64)
        self._last = len(self._counts) - 1
        # gaps added one at a time go to a dict first (bin -> weight) and are folded in when the counts are
        # read: a numpy scalar update costs several times a dict one, and this runs every iteration
        self._pending: dict[int, int] = {}
        self.total = 0

    @property
    def counts(self) -> np.ndarray:
        pending = self._pending
        if pending:
            idx = np.fromiter(pending.keys(), np.int64, len(pending))
            self._counts[idx] += np.fromiter(pending.values(), np.int64, len(pending))  # distinct bins
            pending.clear()
        return self._counts

    def _bin(self, gaps: np.ndarray) -> np.ndarray:
        # `add`'s formula with numpy's log10, in place on one copy (most stretches bin a few dozen gaps, where
        # each ufunc call costs more than its work): gaps floored at 10^LOW_EXP put every lower bin at or just
        # above 0 (log10 of it may round a hair below LOW_EXP), where truncation gives 0 as floor-then-clamp
        # did, so no floor and no lower clamp are needed
        x = np.maximum(gaps, self.LOWEST)
        np.log10(x, out=x)
        x -= self.LOW_EXP
        x *= self.PER_DECADE
        idx = x.astype(np.int64)
        return np.minimum(idx, self._last, out=idx)

    def add(self, gap: float, weight: int) -> None:
        i = int((log10(max(self.LOWEST, gap)) - self.LOW_EXP) * self.PER_DECADE)  # as _bin: truncation
        if i > self._last:  # noqa: PLR1730 - a compare costs less than min() on this per-iteration path
            i = self._last
        pending = self._pending
        pending[i] = pending.get(i, 0) + weight
        self.total += weight

    def extend(self, gaps: np.ndarray, weight: int) -> None:
        idx = self._bin(gaps)
        if len(idx) > 64:
            np.add.at(self._counts, idx, weight)
        else:  # np.add.at's set-up costs more than a few dict updates
            pending = self._pending
            for i in idx.tolist():
                pending[i] = pending.get(i, 0) + weight
        self.total += weight * len(gaps)

    def merge(self, other: GapHistogram) -> None:
        """Add another histogram's gaps (e.g. the repeats of one run)."""
        counts = self.counts
        counts += other.counts
        self.total += other.total

    def percentiles(self, pcts: tuple[int, ...]) -> list[float | None]:
        """Inverted-CDF percentiles (a value some gap really took, to the bin's resolution)."""
        if self.total == 0:
            return [None] * len(pcts)
        cum = np.cumsum(self.counts)
        idx = np.searchsorted(cum, np.asarray(pcts) / 100.0 * self.total, side="left")
        return [float(10 ** (self.LOW_EXP + (i + 0.5) / self.PER_DECADE)) for i in idx]


@dataclass
class Records:
    """What one replica records while it serves: iteration rows, token gaps, the queue each arrival saw."""

    iterations: IterationLog = field(default_factory=IterationLog)
    gaps: GapHistogram = field(default_factory=GapHistogram)
    queue_at_arrival: array = field(default_factory=lambda: array("q"))  # waiting requests, arrival included

    def queue_lengths(self) -> np.ndarray:
        return np.frombuffer(self.queue_at_arrival, dtype=np.int64).copy()


def request_frame(seqs: list[Seq]) -> pd.DataFrame:
    """`request_columns` as a table."""
    import pandas as pd  # only where a table is asked for: a run's summary reads the columns

    return pd.DataFrame(request_columns(seqs))


def request_columns(seqs: list[Seq]) -> dict[str, np.ndarray]:
    """One row per request, by column; times in seconds, -1 where the event never happened (run cut
    short). A run with sessions adds each request's `session` and `turn` (0 for a session's first; -1 for a
    request of no session)."""
    n = len(seqs)
    columns = {
        "request_id": np.fromiter((s.id for s in seqs), np.int64, n),
        "arrival_s": np.fromiter((s.arrival_s for s in seqs), np.float64, n),
        "first_scheduled_s": np.fromiter((s.first_scheduled_s for s in seqs), np.float64, n),
        "first_token_s": np.fromiter((s.first_token_s for s in seqs), np.float64, n),
        "completion_s": np.fromiter((s.completion_s for s in seqs), np.float64, n),
        "prompt_tokens": np.fromiter((s.prompt_tokens for s in seqs), np.int64, n),
        "output_tokens": np.fromiter((s.output_tokens for s in seqs), np.int64, n),
        "generated_tokens": np.fromiter((s.generated for s in seqs), np.int64, n),
        "preemptions": np.fromiter((s.preemptions for s in seqs), np.int64, n),
        "max_tbt_s": np.fromiter((s.max_gap_s for s in seqs), np.float64, n),
    }
    session = np.fromiter((s.session for s in seqs), np.int64, n)
    if (session >= 0).any():
        columns["session"] = session
        columns["turn"] = turn_index(columns["request_id"], session)
    return columns


def turn_index(request_id: np.ndarray, session: np.ndarray) -> np.ndarray:
    """Each request's turn in its session, 0 for the first: its rank by id among its session's requests
    (a session's turns are numbered in order, `simctl.traces.sessions`); -1 outside a session."""
    order = np.lexsort((request_id, session))
    s = session[order]
    first = np.ones(len(s), dtype=bool)
    first[1:] = s[1:] != s[:-1]
    position = np.arange(len(s))
    turn = np.empty(len(s), dtype=np.int64)
    turn[order] = position - np.maximum.accumulate(np.where(first, position, 0))
    turn[session < 0] = -1
    return turn
