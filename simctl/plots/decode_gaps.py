"""Time between tokens read back from a run's iteration rows (`iterations.parquet`), for figures.

A run records its token gaps only as a histogram (serving/records.py), so TBT over time (Sarathi-Serve
Figure 1a: generation stalls) and a TBT CDF per run are derived from the rows: each row says when it started,
how long it ran, how many iterations it repeats (`count`), and how many decode tokens and requests each of
its iterations had.

The decodes of a row that follows the previous decode row directly (the replica never idled in between: it
would not idle with decodes running) waited since that row ended, plus their own iteration: a prefill-only
row in between (vLLM) is a stall they all see. The requests whose prefill completed in those prefill-only rows
are newcomers: their first decode gap counts from their own prefill's end (as many gaps as those rows had
requests, latest first). The later iterations of a stretch of `count` identical decodes each add gaps of the
row's mean duration. Exact for hybrid batches (Orca, Sarathi-Serve) and vLLM's whole prefills; a chunked
prefill that does not complete counts as a newcomer. `tests/test_plots.py` compares the percentiles with the
run's exact ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class DecodeGaps:
    time_s: np.ndarray  # when the gap ended (the token was sampled)
    gap_s: np.ndarray  # time since the request's previous token
    weight: np.ndarray  # how many tokens saw this gap

    def percentile(self, p: float) -> float | None:
        """Inverted-CDF weighted percentile (as the run's own TBT percentiles)."""
        if self.weight.sum() == 0:
            return None
        order = np.argsort(self.gap_s, kind="stable")
        cum = np.cumsum(self.weight[order])
        return float(self.gap_s[order][np.searchsorted(cum, p / 100.0 * cum[-1], side="left")])


def decode_gaps(iterations: pd.DataFrame) -> DecodeGaps:
    """Every decode token's gap, grouped: one entry per (row, gap value) with its token count."""
    its = iterations.sort_values("start_s", kind="stable")
    start = its["start_s"].to_numpy(float)
    dur = its["duration_s"].to_numpy(float)
    count = its["count"].to_numpy(np.int64)
    decode = its["decode_tokens"].to_numpy(np.int64)
    batch = its["batch_size"].to_numpy(np.int64)
    times: list[float] = []
    gaps: list[float] = []
    weights: list[int] = []
    last_decode_end: float | None = None
    newcomers: list[tuple[float, int]] = []  # (prefill row end, requests) since the last decode row
    prev_end = -np.inf
    for s, d, c, n, b in zip(start, dur, count, decode, batch):
        if s > prev_end:  # the replica idled: no decode was running
            last_decode_end, newcomers = None, []
        prev_end = s + d
        if n == 0:
            newcomers.append((s + d, int(b)))
            continue
        mean = d / c
        first_end = s + mean
        left = int(n)
        for end, k in reversed(newcomers):
            k = min(k, left)
            if k:
                times.append(first_end), gaps.append(first_end - end), weights.append(k)
            left -= k
        if left and last_decode_end is not None:
            times.append(first_end), gaps.append(first_end - last_decode_end), weights.append(left)
        if c > 1:
            times.append(s + d), gaps.append(mean), weights.append(int(n) * (int(c) - 1))
        last_decode_end, newcomers = s + d, []
    return DecodeGaps(np.asarray(times, float), np.asarray(gaps, float), np.asarray(weights, np.int64))
