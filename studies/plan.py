"""Sizing: the fewest GPUs that serve a rate within an SLO. Every candidate configuration (policy, its key
settings, TP degree, GPU) gets its capacity per replica from `studies.capacity` (one search each, in its
process pool); a candidate then needs ceil(rate / capacity) replicas behind a router, and the best choices are
checked by a cluster run at the rate (the SLO judged as `studies.goodput` judges a deployment), a replica
added while the check fails. Costs per million output tokens follow from prices per GPU-hour."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from common.errors import InputError
from results.slo import SLO
from sim.cluster_config import ClusterConfig
from sim.run import RunConfig, run
from studies.capacity import Capacity, CapacityConfig, search_capacities
from studies.goodput import with_attainment

# the settings that trade latency for throughput, searched where a candidate policy takes them (a user's list
# of the same setting replaces these)
KEY_SETTINGS: dict[str, tuple[int, ...]] = {"token_budget": (256, 512, 1024, 2048),
                                            "max_num_batched_tokens": (512, 1024, 2048, 4096)}
CHECK_ROUTER = "least-outstanding"
MAX_EXTRA_REPLICAS = 2  # replicas a failed check may add before the choice is dropped


@dataclass(frozen=True)
class PlanSpec:
    configs: list[RunConfig]  # the candidates, each one replica
    labels: list[str]
    slo: SLO
    rate: float  # requests per second to serve
    max_gpus: int = 64
    prices: dict[str, float] | None = None  # GPU name -> price per GPU-hour
    checks: int = 3  # the best choices checked by a cluster run at the rate
    workers: int | None = None

    def validate(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise InputError(f"--rate must be a finite number > 0 (requests per second), got {self.rate!r}")
        if self.max_gpus < 1:
            raise InputError(f"--max-gpus must be >= 1, got {self.max_gpus}")
        searched = sorted({c.gpu for c in self.configs})
        for gpu, price in (self.prices or {}).items():
            if gpu not in searched:
                raise InputError(f"--gpu-cost {gpu}: not a GPU searched ({', '.join(searched)})")
            if not (price > 0 and math.isfinite(price)):
                raise InputError(f"--gpu-cost {gpu}={price!r}: give a price > 0 per GPU-hour")


@dataclass(frozen=True)
class Choice:
    """A candidate sized for the rate."""

    label: str
    config: RunConfig
    capacity_qps: float  # one replica's
    replicas: int
    at_capacity: dict[str, Any]  # one replica's run at its capacity
    rate: float
    price: float | None = None  # per GPU-hour
    checked: bool | None = None  # a cluster run at the rate met the SLO (None: not checked)

    @property
    def gpus(self) -> int:
        return self.replicas * self.config.tp

    @property
    def qps_per_gpu(self) -> float:
        return self.capacity_qps / self.config.tp

    @property
    def tokens_per_gpu(self) -> float:
        """Output tokens/s per GPU of a replica at its capacity."""
        return self.at_capacity["throughput_tokens_per_s"] / self.config.tp

    @property
    def tokens_per_user(self) -> float | None:
        """Output tokens/s one request sees at capacity: 1 / median TPOT."""
        tpot = self.at_capacity.get("tpot_p50")
        return 1 / tpot if tpot else None

    @property
    def headroom(self) -> float:
        """Rate the replicas sustain beyond the one asked, as a share of it."""
        return self.replicas * self.capacity_qps / self.rate - 1

    @property
    def served_tokens_per_s(self) -> float:
        """Output tokens/s at the rate: requests served (not refused as too long) times their mean output."""
        s = self.at_capacity
        served = s["num_requests"] / (s["num_requests"] + s.get("rejected", 0))
        return self.rate * served * s["throughput_tokens_per_s"] / s["throughput_rps"]

    @property
    def cost_per_million_tokens(self) -> float | None:
        if self.price is None:
            return None
        return cost_per_million(self.price, self.gpus, self.served_tokens_per_s)


def cost_per_million(price_per_gpu_hour: float, gpus: int, tokens_per_s: float) -> float:
    """Dollars per million output tokens: the GPUs' price per second over the tokens they make per second."""
    return price_per_gpu_hour * gpus / 3600 / tokens_per_s * 1e6


def size(c: Capacity, rate: float, prices: dict[str, float]) -> Choice | None:
    """A candidate's replicas for the rate (None: no rate met the SLO on one replica)."""
    at = c.median_search.at_capacity
    if c.qps <= 0 or at is None or not at["throughput_rps"]:
        return None
    assert c.config is not None
    return Choice(c.name, c.config, c.qps, math.ceil(rate / c.qps), at, rate, prices.get(c.config.gpu))


def check(choice: Choice, slo: SLO) -> Choice:
    """Serve the rate on the choice's replicas (as many requests per replica as one probe had); add a
    replica while the SLO is missed, up to MAX_EXTRA_REPLICAS."""
    for replicas in range(choice.replicas, choice.replicas + MAX_EXTRA_REPLICAS + 1):
        config = replace(choice.config, qps=choice.rate, num_requests=choice.config.num_requests * replicas)
        r = run(config, ClusterConfig(replicas=replicas, router=CHECK_ROUTER))
        if with_attainment(r.summary, r.result.requests, slo)["slo_met"]:
            return replace(choice, replicas=replicas, checked=True)
    return replace(choice, checked=False)


def rank_key(c: Choice) -> tuple[float, float, float]:
    """Fewest GPUs first, then the cheapest, then the most headroom."""
    cost = c.cost_per_million_tokens
    return (c.gpus, cost if cost is not None else 0.0, -c.headroom)


def plan(spec: PlanSpec) -> tuple[list[Choice], list[Capacity]]:
    """The candidates within --max-gpus, ranked, the best `checks` checked; and every capacity search."""
    spec.validate()
    capacities = search_capacities(CapacityConfig(spec.configs, {"plan": spec.slo}, workers=spec.workers,
                                                  labels=spec.labels))
    sized = sorted((c for c in (size(r, spec.rate, spec.prices or {}) for r in capacities) if c is not None),
                   key=rank_key)
    if not sized:
        raise InputError("no configuration meets the SLO on one replica at any rate searched: relax the SLO "
                         "or add GPUs, TP degrees or policies")
    checked = sorted((check(c, spec.slo) for c in sized[:spec.checks]), key=lambda c: (not c.checked,
                                                                                       *rank_key(c)))
    choices = [c for c in checked + sized[spec.checks:] if c.gpus <= spec.max_gpus]
    if not choices:
        best = max(sized, key=lambda c: c.qps_per_gpu)
        reach = best.qps_per_gpu * (spec.max_gpus // best.config.tp * best.config.tp)
        raise InputError(f"no configuration serves {spec.rate:g} QPS within --max-gpus {spec.max_gpus}: the "
                         f"best reaches {reach:.3g} QPS ({best.label}, {best.qps_per_gpu:.3g} QPS per GPU)")
    return choices, capacities
