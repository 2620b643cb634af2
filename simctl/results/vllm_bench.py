"""vLLM's benchmark metrics (`vllm bench serve`), under its names and by its definitions
(vllm/benchmarks/serve.py: `calculate_metrics`), beside simctl's own in every summary (`vllm_bench`).

Over completed requests: TTFT; E2EL (vLLM's latency: arrival to last token); TPOT = (E2EL - TTFT) / (output
tokens - 1) over requests of more than one token; ITL = every gap between consecutive tokens, pooled. Each as
mean, median and P99 in ms (np.percentile's linear interpolation). Throughputs divide by vLLM's duration,
from the benchmark's start (t=0 of the run's clock: as vLLM's sender, a trace's first request arrives one gap
after it) to the last completion: `request_throughput` (completed requests), `output_throughput` (their
output tokens), `total_token_throughput` (prompt and output tokens).

What simctl already computes is reused: the medians and P99s of TTFT, TPOT and E2E are the summary's
`*_p50`/`*_p99` (the same numpy percentiles). The mean ITL is exact without the gaps: a request's gaps sum to
its last token time less its first, so it is sum(E2EL - TTFT) / sum(output tokens - 1). The median and P99 ITL
are the summary's TBT percentiles, read off the run's gap histogram (serving.records.GapHistogram, which keeps
memory constant in the number of tokens): a bin's geometric centre, within 0.006%, by the inverted CDF
rather than vLLM's interpolation between two gaps, and pooled over every request's gaps (those of requests
still unfinished when a run gave up included).

Goodput (vLLM's `--goodput ttft:MS tpot:MS e2el:MS`, DistServe's definition): completed requests meeting every
limit given (TPOT of a one-token request is 0), per second of the duration. It is `results.slo`'s per-request
SLO (`SLO.meeting`) with the limits in seconds: `request_goodput` = meeting / duration. """

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from simctl.common.durations import seconds_of
from simctl.common.errors import InputError
from simctl.results.slo import SLO

if TYPE_CHECKING:
    from simctl.serving.records import RequestTable

METRICS = ("ttft", "tpot", "itl", "e2el")  # vLLM's names; simctl's: ttft, tpot, tbt, e2e
OURS = {"ttft": "ttft", "tpot": "tpot", "itl": "tbt", "e2el": "e2e"}
GOODPUT_KEYS = ("ttft", "tpot", "e2el")
THROUGHPUTS = ("request_throughput", "output_throughput", "total_token_throughput")
KEYS = (*(f"{s}_{m}_ms" for m in METRICS for s in ("mean", "median", "p99")), *THROUGHPUTS)
ITL_PERCENTILES = "median and P99 ITL read off the gap histogram (bin centre, within 0.006%)"


@dataclass(frozen=True)
class Stats:
    """One metric's mean, median and P99, in seconds (None without values)."""

    mean: float | None
    median: float | None
    p99: float | None

    @classmethod
    def of(cls, values: np.ndarray) -> Stats:
        """vLLM's statistics of `values`."""
        if len(values) == 0:
            return cls(None, None, None)
        return cls(float(np.mean(values)), float(np.median(values)), float(np.percentile(values, 99)))


def _ms(v: float | None) -> float | None:
    return None if v is None else v * 1000.0


def block(stats: Mapping[str, Stats], completed: int, output_tokens: int, total_tokens: int, duration_s: float
          ) -> dict[str, float | None]:
    """The `vllm_bench` block: each metric of METRICS in ms, and the throughputs over `duration_s`."""
    out: dict[str, float | None] = {}
    for m in METRICS:
        s = stats[m]
        out.update({f"mean_{m}_ms": _ms(s.mean), f"median_{m}_ms": _ms(s.median), f"p99_{m}_ms": _ms(s.p99)})
    per_s = 1 / duration_s if duration_s > 0 else 0.0
    out.update({"request_throughput": completed * per_s, "output_throughput": output_tokens * per_s,
                "total_token_throughput": total_tokens * per_s})
    return out


def summary_block(summary: Mapping[str, object], ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray,
                  outputs: np.ndarray, prompts: np.ndarray, end: np.ndarray) -> dict[str, float | None]:
    """The block of a run's summary, from the summary's percentiles and its completed requests' TTFT, TPOT,
    E2E, output and prompt tokens and completion times (see the module docstring)."""
    def mean(values: np.ndarray) -> float | None:
        return float(np.mean(values)) if len(values) else None

    def pcts(ours: str) -> tuple[float | None, float | None]:
        return summary[f"{ours}_p50"], summary[f"{ours}_p99"]  # type: ignore[return-value]

    gaps = int((outputs - 1).sum())
    itl_mean = float((e2e - ttft).sum()) / gaps if gaps else None
    means = {"ttft": mean(ttft), "tpot": mean(tpot), "itl": itl_mean, "e2el": mean(e2e)}
    stats = {m: Stats(means[m], *pcts(OURS[m])) for m in METRICS}
    return block(stats, len(end), int(outputs.sum()), int(outputs.sum() + prompts.sum()), duration_of(end))


def duration_of(end: np.ndarray) -> float:
    """vLLM's duration: from t=0 to the last of the completed requests' completion times `end`."""
    return float(end.max()) if len(end) else 0.0


@dataclass(frozen=True)
class GoodputLimits:
    """vLLM's --goodput limits, in ms, by vLLM's names (ttft, tpot, e2el)."""

    limits_ms: Mapping[str, float]

    def slo(self) -> SLO:
        return SLO(per_request={OURS[k]: v / 1000.0 for k, v in self.limits_ms.items()})

    def describe(self) -> str:
        return " ".join(f"{k}:{v:g}" for k, v in self.limits_ms.items())

    def request_goodput(self, requests: RequestTable, duration_s: float) -> float:
        """Requests of a requests table meeting every limit, per second of `duration_s` (vLLM's duration)."""
        return self.slo().meeting(requests) / duration_s if duration_s > 0 else 0.0


def parse_goodput(values: list[str] | None) -> GoodputLimits | None:
    """vLLM's `--goodput` items, KEY:MS (ttft, tpot, e2el), given as separate values or separated by commas
    or spaces within one, in milliseconds as vLLM's bench takes them, or with a unit (500ms, 0.5s); None
    when none is given."""
    items = [item for v in values or [] for item in str(v).replace(",", " ").split()]
    if not items:
        return None
    limits: dict[str, float] = {}
    for item in items:
        key, sep, text = item.partition(":")
        if not sep or key not in GOODPUT_KEYS:
            raise InputError(f"--goodput {item!r}: give KEY:MS items with KEY one of "
                             f"{', '.join(GOODPUT_KEYS)}, e.g. --goodput ttft:500,tpot:50 (vLLM's bench "
                             "--goodput, in milliseconds)")
        try:
            ms = seconds_of(text, "ms") * 1000.0
        except ValueError:
            raise InputError(f"--goodput {item!r}: {text!r} is not a number of milliseconds (or of seconds "
                             "with s, e.g. 0.5s)") from None
        if not (ms > 0 and math.isfinite(ms)):
            raise InputError(f"--goodput {item!r}: the limit must be a positive, finite number of "
                             "milliseconds")
        if key in limits:
            raise InputError(f"--goodput: {key} is given twice")
        limits[key] = ms
    return GoodputLimits(limits)


def with_goodput(summary: dict[str, object], requests: RequestTable, goodput: GoodputLimits | None
                 ) -> dict[str, object]:
    """The summary with `vllm_bench.request_goodput` (and the limits, `vllm_bench.goodput`), when given."""
    if goodput is None:
        return summary
    bench = dict(summary["vllm_bench"])  # type: ignore[call-overload]
    bench["goodput"] = goodput.describe()
    end = np.asarray(requests["completion_s"])
    bench["request_goodput"] = goodput.request_goodput(requests, duration_of(end[end >= 0]))
    return {**summary, "vllm_bench": bench}
