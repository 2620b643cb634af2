"""Sizing: the fewest GPUs that serve a rate within an SLO. Every candidate (policy, its key settings, TP
degree, GPU; colocated, or a disaggregated unit of P prefill and D decode instances where the policy can
serve so) gets its capacity per unit from `simctl.studies.capacity` (one search each, in its process pool); a
candidate then needs ceil(rate / capacity) units, and the choices are checked by a cluster run at the rate
(the SLO judged as `studies.goodput` judges a deployment; a unit added while the check fails), fewest GPUs
first, until no unchecked estimate has fewer GPUs than the answer (`select`). A candidate whose model does not
fit its GPUs, or whose KV cache cannot hold the longest request, is skipped (`fitting`). Costs per million
output tokens follow from prices per GPU-hour."""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from simctl.catalogue.gpus import get_gpu
from simctl.common.errors import DoesNotFit, InputError
from simctl.results.slo import SLO
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig, check_fit, run
from simctl.studies.capacity import Capacity, CapacityConfig, parallel_map, search_capacities
from simctl.studies.goodput import with_attainment

# the settings that trade latency for throughput, searched where a candidate policy takes them (a user's list
# of the same setting replaces these)
KEY_SETTINGS: dict[str, tuple[int, ...]] = {"token_budget": (256, 512, 1024, 2048),
                                            "max_num_batched_tokens": (512, 1024, 2048, 4096)}
PD_SPLITS: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (2, 1))  # (prefill, decode) instances of a unit
CHECK_ROUTER = "least-outstanding"
MAX_EXTRA_REPLICAS = 2  # units a failed check may add before the choice is kept as failed
PlanProgress = Callable[[str, int, int], None]  # (the stage, done, total)


def link_gbps(gpu: str) -> float:
    """The default KV link of a P/D unit: its GPUs' own interconnect, one direction (the unit's instances on
    one node, as DistServe places them)."""
    return get_gpu(gpu).interconnect_bandwidth * 8 / 1e9


@dataclass(frozen=True)
class Candidate:
    """A configuration and how one unit of it is deployed: one replica, or P prefill and D decode instances
    joined by a KV link."""

    config: RunConfig
    label: str
    split: tuple[int, int] | None = None  # (prefill, decode) instances; None: colocated
    kv_link_gbps: float | None = None  # the P/D link

    @property
    def gpus(self) -> int:
        """GPUs of one unit."""
        return self.config.tp * self.config.pp * (sum(self.split) if self.split else 1)

    def cluster(self, units: int, router: str = CHECK_ROUTER) -> ClusterConfig:
        if self.split is None:
            return ClusterConfig(replicas=units, router=router)
        return ClusterConfig(router=router, prefill_instances=self.split[0] * units,
                             decode_instances=self.split[1] * units, kv_link_gbps=self.kv_link_gbps)


@dataclass(frozen=True)
class PlanSpec:
    candidates: list[Candidate]
    slo: SLO
    rate: float  # requests per second to serve (offered: those refused as too long included)
    max_gpus: int = 64
    prices: dict[str, float] | None = None  # GPU name -> price per GPU-hour
    checks: int = 3  # the best choices checked by a cluster run at the rate
    workers: int | None = None

    def validate(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise InputError(f"--rate must be a finite number > 0 (requests per second), got {self.rate!r}")
        if self.max_gpus < 1:
            raise InputError(f"--max-gpus must be >= 1, got {self.max_gpus}")
        if self.checks < 0:
            raise InputError(f"--checks must be >= 0, got {self.checks}")
        if any(c.config.workload.concurrency is not None for c in self.candidates):
            raise InputError("--concurrency: plan sizes a deployment for a rate (--rate); sizing for "
                             "closed-loop clients is not built (`simctl capacity --concurrency N` finds one "
                             "replica's highest concurrency)")
        searched = sorted({c.config.gpu for c in self.candidates})
        for gpu, price in (self.prices or {}).items():
            if gpu not in searched:
                raise InputError(f"--gpu-cost {gpu}: not a GPU searched ({', '.join(searched)})")
            if not (price > 0 and math.isfinite(price)):
                raise InputError(f"--gpu-cost {gpu}={price!r}: give a price > 0 per GPU-hour")
        for c in self.candidates:
            c.config.validate()
            c.cluster(1).validate(c.config.policy)


@dataclass(frozen=True)
class Choice:
    """A candidate sized for the rate."""

    candidate: Candidate
    capacity_qps: float  # one unit's
    replicas: int  # units: replicas, or P/D units
    at_capacity: dict[str, Any]  # one unit's run at its capacity
    rate: float
    price: float | None = None  # per GPU-hour
    checked: bool | None = None  # a cluster run at the rate met the SLO (None: not checked)

    @property
    def label(self) -> str:
        return self.candidate.label

    @property
    def config(self) -> RunConfig:
        return self.candidate.config

    @property
    def gpus(self) -> int:
        return self.replicas * self.candidate.gpus

    @property
    def qps_per_gpu(self) -> float:
        return self.capacity_qps / self.candidate.gpus

    @property
    def tokens_per_gpu(self) -> float:
        """Output tokens/s per GPU of a unit at its capacity."""
        return self.at_capacity["throughput_tokens_per_s"] / self.candidate.gpus

    @property
    def tokens_per_user(self) -> float | None:
        """Output tokens/s one request sees at capacity: 1 / median TPOT."""
        tpot = self.at_capacity.get("tpot_p50")
        return 1 / tpot if tpot else None

    @property
    def headroom(self) -> float:
        """Rate the units sustain beyond the one asked, as a share of it."""
        return self.replicas * self.capacity_qps / self.rate - 1

    @property
    def refused_share(self) -> float:
        """Share of the requests offered refused as longer than the max model length."""
        s = self.at_capacity
        return s.get("rejected", 0) / (s["num_requests"] + s.get("rejected", 0))

    @property
    def served_tokens_per_s(self) -> float:
        """Output tokens/s at the rate: requests served (not refused as too long) times their mean output."""
        s = self.at_capacity
        return self.rate * (1 - self.refused_share) * s["throughput_tokens_per_s"] / s["throughput_rps"]

    @property
    def cost_per_million_tokens(self) -> float | None:
        if self.price is None:
            return None
        return cost_per_million(self.price, self.gpus, self.served_tokens_per_s)


def cost_per_million(price_per_gpu_hour: float, gpus: int, tokens_per_s: float) -> float:
    """Dollars per million output tokens: the GPUs' price per second over the tokens they make per second."""
    return price_per_gpu_hour * gpus / 3600 / tokens_per_s * 1e6


def size(c: Capacity, candidate: Candidate, rate: float, prices: dict[str, float]) -> Choice | None:
    """A candidate's units for the rate (None: no rate met the SLO on one unit)."""
    at = c.median_search.at_capacity
    if c.qps <= 0 or at is None or not at["throughput_rps"]:
        return None
    return Choice(candidate, c.qps, math.ceil(rate / c.qps), at, rate, prices.get(candidate.config.gpu))


def check(choice: Choice, slo: SLO, max_gpus: int) -> Choice:
    """Serve the rate on the choice's units (as many requests per unit as one probe had); add a unit while
    the SLO is missed, up to MAX_EXTRA_REPLICAS and within `max_gpus`."""
    for replicas in range(choice.replicas, choice.replicas + MAX_EXTRA_REPLICAS + 1):
        if replicas * choice.candidate.gpus > max_gpus:
            break
        config = choice.config.with_workload(qps=choice.rate,
                                              num_requests=choice.config.workload.num_requests * replicas)
        r = run(config, choice.candidate.cluster(replicas))
        if with_attainment(r.summary, r.result.request_columns, slo)["slo_met"]:
            return replace(choice, replicas=replicas, checked=True)
    return replace(choice, checked=False)


def rank_key(c: Choice) -> tuple[float, float, float]:
    """Fewest GPUs first, then the cheapest, then the most headroom."""
    cost = c.cost_per_million_tokens
    return (c.gpus, cost if cost is not None else 0.0, -c.headroom)


def final_key(c: Choice) -> tuple[float, ...]:
    """Choices a check confirmed first, then those not checked (estimates), then those that failed it."""
    return ({True: 0, None: 1, False: 2}[c.checked], *rank_key(c))


def fitting(candidates: list[Candidate]) -> tuple[list[Candidate], dict[str, list[Candidate]]]:
    """The candidates whose model fits their GPUs' memory and whose KV cache holds the trace's longest
    request, and those that do not, by the reason (one line each); InputError, with the first reason, when
    none fits."""
    fit: list[Candidate] = []
    unfit: dict[str, list[Candidate]] = {}
    for c in candidates:
        try:
            check_fit(c.config, c.cluster(1))
        except DoesNotFit as e:
            unfit.setdefault(str(e), []).append(c)
        else:
            fit.append(c)
    if not fit:
        raise InputError(f"none of the {len(candidates)} configurations fits its GPUs: {next(iter(unfit))}")
    return fit, unfit


def select(sized: list[Choice], checks: int, check_batch: Callable[[list[Choice]], list[Choice]],
           batch: int = 1) -> list[Choice]:
    """The choices ranked: at least the best `checks` checked in order of GPUs, then every one whose estimate
    has fewer GPUs than the fewest a check confirmed, so that the answer is the fewest GPUs a check passed
    (none passing, every choice is checked); `checks` 0: estimates alone. `check_batch` checks up to `batch`
    choices at a time (side by side: at most `batch` - 1 checks more than one at a time would run)."""
    pending = sorted(sized, key=rank_key)
    done: list[Choice] = []
    while pending and checks > 0:
        confirmed = min((c.gpus for c in done if c.checked), default=math.inf)
        due = len(done) < checks
        take = [i for i, c in enumerate(pending) if due or c.gpus < confirmed]
        take = take[:max(batch, checks - len(done))]
        if not take:
            break
        done += check_batch([pending[i] for i in take])
        pending = [c for i, c in enumerate(pending) if i not in take]
    return sorted(done + pending, key=final_key)


def _check_job(args: tuple[Choice, SLO, int]) -> Choice:
    return check(*args)


def plan(spec: PlanSpec, progress: PlanProgress | None = None) -> tuple[list[Choice], list[Capacity]]:
    """The candidates within --max-gpus, ranked, checked as `select` says; and every capacity search.
    `progress` is told each stage's (what, done, total)."""
    spec.validate()
    report = progress or (lambda what, done, total: None)
    capacities = search_capacities(CapacityConfig(
        [c.config for c in spec.candidates], {"plan": spec.slo}, workers=spec.workers,
        labels=[c.label for c in spec.candidates], clusters=[c.cluster(1) for c in spec.candidates]),
        lambda done, total: report("capacity searches", done, total))
    sized = sorted((s for s in (size(r, c, spec.rate, spec.prices or {})
                                for r, c in zip(capacities, spec.candidates)) if s is not None), key=rank_key)
    if not sized:
        lowest = min(p["qps"] for r in capacities for p in r.probes)
        raise InputError(f"no configuration meets the SLO on one replica at any rate probed, down to "
                         f"{lowest:.3g} QPS: relax the SLO or add GPUs, TP degrees or policies")
    within = [c for c in sized if c.gpus <= spec.max_gpus]
    if not within:
        raise InputError(f"no configuration serves {spec.rate:g} QPS within --max-gpus {spec.max_gpus}: "
                         + best_reached(sized, spec.max_gpus))

    def check_batch(choices: list[Choice]) -> list[Choice]:
        what = f"checking {len(choices)} choice{'s' if len(choices) > 1 else ''} at {spec.rate:g} QPS"
        return parallel_map(_check_job, [(c, spec.slo, spec.max_gpus) for c in choices], spec.workers,
                            lambda done, total: report(what, done, total))

    return select(within, spec.checks, check_batch, spec.workers or os.cpu_count() or 1), capacities


def best_reached(sized: list[Choice], max_gpus: int) -> str:
    """What the best candidate serves on `max_gpus` GPUs (as many whole units as fit)."""
    best = max(sized, key=lambda c: max_gpus // c.candidate.gpus * c.capacity_qps)
    units = max_gpus // best.candidate.gpus
    if units == 0:
        return f"the smallest unit needs {min(c.candidate.gpus for c in sized)} GPUs"
    return (f"the best reaches {units * best.capacity_qps:.3g} QPS ({best.label}, {units} x "
            f"{best.candidate.gpus} GPUs, {best.capacity_qps:.3g} QPS each)")
