"""Service-level objectives a run must meet, and the grammar users write them in.

`--slo` takes comma-separated `key=seconds` items (or with a unit: `p99_tbt=100ms`, `ttft=2s`), and may be
repeated:

- `{p50,p90,p99}_{ttft,tbt,tpot,e2e}`: that percentile of the run is at or under the limit (`p99_tbt=0.1`);
  TBT percentiles pool every gap of every request, as Sarathi-Serve reports P99 TBT.
- plain `ttft`, `tbt`, `tpot`, `e2e`: per-request limits, as DistServe's SLOs: a request meets them or not
  (`tbt`: its largest gap), and the share of requests meeting all of them (`slo_attainment`) must be at least
  `attainment` (default 0.9). DistServe's goodput is the highest rate at which that share is met.

Every SLO also asks for a sustainable run whose requests all finished, and a median scheduling delay within a
limit (2 s: Sarathi-Serve's capacity rule, "the queuing delay does not blow up"). Under the `sustainable`
definition (the default) the run must also not be backlogged (`results.saturation`: a queue that grows within
the run is no capacity, even while the median delay is still short); `paper` is Sarathi-Serve's rule alone.

A summary carries percentiles but not per-request outcomes: `slo_attainment` is computed from the run's
requests table (`SLO.attainment`), by whoever holds it (the capacity probe adds it to each probe's summary),
so `simctl.results.metrics.summarise_result` stays independent of any SLO.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from simctl.common.checks import is_number
from simctl.common.durations import seconds_of
from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq
from simctl.results.saturation import BACKLOGGED, TOO_SHORT

if TYPE_CHECKING:
    from simctl.serving.records import RequestTable

METRICS = ("ttft", "tbt", "tpot", "e2e")
PERCENTILES = (50, 90, 99)
PERCENTILE_KEYS = tuple(f"p{p}_{m}" for m in METRICS for p in PERCENTILES)
DEFAULT_ATTAINMENT = 0.9  # DistServe's goodput: 90% of requests within their SLOs
DEFAULT_SCHED_DELAY_P50_S = 2.0  # Sarathi-Serve Section 5: median scheduling delay under 2 s

# Sarathi-Serve Table 3: P99 TBT limits are these multiples of one decode iteration of a 32-request batch
# whose requests each hold a 4k-token prefill (Mistral-7B on an A100: 0.1 s strict, 0.5 s relaxed)
TABLE3_BATCH = 32
TABLE3_CONTEXT = 4096
TABLE3_FACTORS = {"strict": 5.0, "relaxed": 25.0}
SUSTAINABLE, PAPER = "sustainable", "paper"
DEFINITIONS = {SUSTAINABLE: "a backlogged run (a growing or standing queue) misses the SLO",
               PAPER: "Sarathi-Serve's rule only: a backlogged run may meet the SLO"}


def _seconds(key: str, v: object) -> float:
    if not is_number(v) or not (v > 0 and math.isfinite(v)):  # type: ignore[operator]
        raise InputError(f"SLO {key}: the limit must be a positive, finite number of seconds, got {v!r}")
    return float(v)  # type: ignore[arg-type]


@dataclass(frozen=True)
class SLO:
    percentiles: Mapping[str, float] = field(default_factory=dict)  # e.g. {"p99_tbt": 0.1}
    per_request: Mapping[str, float] = field(default_factory=dict)  # e.g. {"ttft": 2.0, "tpot": 0.1}
    attainment: float = DEFAULT_ATTAINMENT  # share of requests that must meet every per-request limit
    sched_delay_p50_s: float = DEFAULT_SCHED_DELAY_P50_S
    definition: str = SUSTAINABLE  # of capacity: `paper` lets a backlogged run meet the SLO

    def __post_init__(self) -> None:
        if self.definition not in DEFINITIONS:
            raise InputError(f"--capacity-definition {self.definition!r}: choose {', '.join(DEFINITIONS)}")
        for key, v in self.percentiles.items():
            if key not in PERCENTILE_KEYS:
                raise InputError(f"unknown SLO key {key!r}; known: {_known_keys()}")
            _seconds(key, v)
        for key, v in self.per_request.items():
            if key not in METRICS:
                raise InputError(f"unknown SLO key {key!r}; known: {_known_keys()}")
            _seconds(key, v)
        if not is_number(self.attainment) or not 0 < self.attainment <= 1:
            raise InputError(f"--attainment must be a share in (0, 1], got {self.attainment!r}")
        if not is_number(self.sched_delay_p50_s) or not (self.sched_delay_p50_s > 0
                                                         and math.isfinite(self.sched_delay_p50_s)):
            raise InputError("--max-sched-delay-p50 must be a positive, finite number of seconds, "
                             f"got {self.sched_delay_p50_s!r}")

    def met(self, s: Mapping[str, Any]) -> bool:
        """Whether a run's summary meets every limit. A summary without `slo_attainment` cannot be judged
        against per-request limits: that is a caller's bug (see the module docstring), not a miss."""
        return not self.misses(s)

    def misses(self, s: Mapping[str, Any]) -> list[str]:
        """The limits a run's summary misses, by name: `sustainable`, `unfinished` (requests not completed),
        `backlogged`, `too short` (to tell whether it is backlogged), `sched_delay_p50`, a percentile key
        (`p99_tbt`) or `attainment`; empty when it meets them all. What bound a capacity is what the probe
        just above it missed."""
        if not s["sustainable"]:
            return ["sustainable"]
        missed = []
        if s["completed"] < s["num_requests"]:
            missed.append("unfinished")
        if self.definition == SUSTAINABLE and s.get("saturation") in (BACKLOGGED, TOO_SHORT):
            missed.append("backlogged" if s["saturation"] == BACKLOGGED else "too short")  # to tell it is not
        delay = s["sched_delay_p50"]
        if delay is None or delay > self.sched_delay_p50_s:
            missed.append("sched_delay_p50")
        for key, limit in self.percentiles.items():
            value = s[summary_key(key)]
            if value is None or value > limit:
                missed.append(key)
        if self.per_request:
            if "slo_attainment" not in s:
                raise ValueError("per-request SLO limits need the summary's slo_attainment (SLO.attainment)")
            if s["slo_attainment"] < self.attainment:
                missed.append("attainment")
        return missed

    def attainment_of(self, requests: RequestTable, refused: int = 0) -> float:
        """The share of requests meeting every per-request limit (1.0 without any); a request that never
        finished meets none, nor does one the server refused (`refused`, too long: not in the table). Reads a
        requests table (simctl.serving.records.request_columns, or their frame)."""
        n = len(requests["arrival_s"]) + refused
        return self.meeting(requests) / n if n else 0.0

    def meeting(self, requests: RequestTable) -> int:
        """How many requests of a requests table meet every per-request limit (vLLM's good requests)."""
        first = np.asarray(requests["first_token_s"])
        end = np.asarray(requests["completion_s"])
        arrival = np.asarray(requests["arrival_s"])
        outputs = np.asarray(requests["output_tokens"])
        ok = end >= 0
        values = {
            "ttft": first - arrival,
            "e2e": end - arrival,
            "tbt": np.asarray(requests["max_tbt_s"]),
            # a one-token request has no time per output token: it meets any TPOT limit
            "tpot": np.where(outputs > 1, (end - first) / np.maximum(outputs - 1, 1), 0.0),
        }
        for key, limit in self.per_request.items():
            ok &= values[key] <= limit
        return int(ok.sum())

    def describe(self) -> str:
        parts = [f"{key[:3].upper()} {key[4:].upper()} <= {limit:.4g} s"
                 for key, limit in self.percentiles.items()]
        if self.per_request:
            limits = " and ".join(f"{key.upper()} <= {limit:.4g} s"
                                  for key, limit in self.per_request.items())
            parts.append(f"{limits} for >= {self.attainment:.0%} of requests")
        parts += [f"P50 scheduling delay <= {self.sched_delay_p50_s:g} s",
                  "sustainable" if self.definition == PAPER else "sustainable, not backlogged"]
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "percentiles": dict(self.percentiles), "per_request": dict(self.per_request)}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> SLO:
        """An SLO as `to_dict` wrote it, or as validation.json files written before this grammar did
        (`tbt_p99_s`, `ttft_p50_s`, `sched_delay_p50_s`), so that older validations can still be rescored."""
        if "percentiles" in d:
            return cls(dict(d["percentiles"]), dict(d["per_request"]), d["attainment"],
                       d["sched_delay_p50_s"], d.get("definition", PAPER))  # written before: the paper's
        old = {"p99_tbt": d.get("tbt_p99_s"), "p50_ttft": d.get("ttft_p50_s")}
        return cls({k: v for k, v in old.items() if v is not None},
                   sched_delay_p50_s=d.get("sched_delay_p50_s", DEFAULT_SCHED_DELAY_P50_S))


def summary_key(key: str) -> str:
    """The summary's name of a percentile key: `p99_tbt` -> `tbt_p99`."""
    pct, metric = key.split("_")
    return f"{metric}_{pct}"


def _known_keys() -> str:
    return f"{', '.join(METRICS)} (per request) and p50/p90/p99_ttft, _tbt, _tpot, _e2e (e.g. p99_tbt)"


def parse_slo(values: list[str], attainment: float | None = None,
              sched_delay_p50_s: float = DEFAULT_SCHED_DELAY_P50_S) -> SLO:
    """An SLO from `--slo` values (each `key=seconds[,key=seconds...]`); InputError on an unknown key, a
    malformed item, a key given twice, or a limit that is not a positive, finite number of seconds."""
    percentiles: dict[str, float] = {}
    per_request: dict[str, float] = {}
    for value in values:
        for item in str(value).split(","):
            key, sep, text = (part.strip() for part in item.partition("="))
            if not sep or not key or not text:
                raise InputError(f"--slo {value!r}: give key=seconds items, e.g. p99_tbt=0.1,p50_ttft=2")
            if key not in PERCENTILE_KEYS and key not in METRICS:
                raise InputError(f"--slo {value!r}: unknown key {key!r}; known: {_known_keys()}")
            try:
                seconds = seconds_of(text, "s")
            except ValueError:
                raise InputError(f"--slo {value!r}: {key}'s limit {text!r} is not a number of seconds (or "
                                 "of milliseconds with ms, e.g. 100ms)") from None
            target = per_request if key in METRICS else percentiles
            if key in target:
                raise InputError(f"--slo: {key} is given twice")
            target[key] = _seconds(key, seconds)
    if attainment is not None and not per_request:
        raise InputError(
            "--attainment applies to per-request SLO keys (ttft, tbt, tpot, e2e), and none is given")
    return SLO(percentiles, per_request, DEFAULT_ATTAINMENT if attainment is None else attainment,
               sched_delay_p50_s)


def table3_decode_time(cost: CostModel) -> float:
    """Seconds of the decode iteration Sarathi-Serve's Table 3 scales: 32 requests, each decoding after a
    4k-token prefill, priced by `cost` (the run's model, GPU and TP)."""
    seqs = [Seq(i, 0.0, TABLE3_CONTEXT, 2) for i in range(TABLE3_BATCH)]
    for s in seqs:  # the prompt cached and its first token sampled: the next iteration decodes
        s.computed = TABLE3_CONTEXT
        s.generated = 1
    return cost.iteration_time(hybrid(seqs, [], []))


def table3_slos(cost: CostModel, sched_delay_p50_s: float = DEFAULT_SCHED_DELAY_P50_S) -> dict[str, SLO]:
    """Sarathi-Serve's strict and relaxed SLOs for this deployment: P99 TBT within 5x and 25x
    `table3_decode_time`."""
    decode = table3_decode_time(cost)
    return {name: SLO({"p99_tbt": factor * decode}, sched_delay_p50_s=sched_delay_p50_s)
            for name, factor in TABLE3_FACTORS.items()}
