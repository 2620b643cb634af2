"""Capacity: the highest request rate a replica sustains while meeting its SLOs (Sarathi-Serve, Section 5.1),
found by bisection over QPS, once per seed when asked (`CapacityConfig.seeds`), under one or more SLOs.

A search (`search_qps`) multiplies or divides its start rate until the capacity is bracketed within
MIN_QPS..MAX_QPS, then bisects; with closed-loop clients (`search_concurrency`) it searches the number of
clients instead (`CapacityResult.variable`), and `CapacityResult.problem` says when there is no answer. A
trace file's own arrival times are time-scaled to each probed rate (`traces.build`). `search_capacities` runs
every configuration x SLO x seed in a process pool and gives per configuration and SLO the median over seeds
with its spread (`Capacity`); `studies.capacity_files` writes them."""

from __future__ import annotations

import os
import signal
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.common.checks import is_int, is_number
from simctl.common.children import stop_pool
from simctl.common.errors import InputError
from simctl.results.slo import (  # SLO: callers import it from here too
    DEFAULT_SCHED_DELAY_P50_S,
    SLO,
    table3_decode_time,
    table3_slos,
)
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import MAX_CLOCK_S, RunConfig, cost_model, run

MAX_QPS = 1e9  # the search stops doubling here: no replica serves a billion requests a second
MIN_QPS = 1e-4  # ... and stops halving here (one request every 3 hours)
# Fewer requests per probe end before a queue can build up: every rate looks sustainable, and the search would
# report its own limit instead of the replica's capacity.
MIN_PROBE_REQUESTS = 100


def lowest_qps(num_requests: int) -> float:
    """The lowest rate a search probes: MIN_QPS, or the rate below which `num_requests` would arrive beyond
    the simulated clock."""
    return max(MIN_QPS, num_requests / MAX_CLOCK_S)


def check_start_qps(start_qps: float, num_requests: int) -> None:
    """Refuse a first rate outside the rates the search probes: it would name the wrong limit or none."""
    lowest = lowest_qps(num_requests) if is_int(num_requests) and num_requests > 0 else MIN_QPS
    if not (is_number(start_qps) and lowest <= start_qps <= MAX_QPS):
        raise InputError(f"--start-qps must be a rate from {lowest:.3g} to {MAX_QPS:.3g} requests per second "
                         f"(the rates a search probes), got {start_qps!r}")


def check_probe_requests(num_requests: int) -> None:
    if num_requests < MIN_PROBE_REQUESTS:
        raise InputError(f"--num-requests {num_requests}: a capacity search needs at least "
                         f"{MIN_PROBE_REQUESTS} requests per probe; shorter runs end before a queue can "
                         "build up, so every rate would look sustainable")


@dataclass
class CapacityResult:
    # the highest probed value of `variable` that met the SLO (0 if none did): a rate, or with closed-loop
    # clients the concurrency (its run's throughput_rps is the rate it reached)
    qps: float
    probes: list[dict[str, Any]]  # every run's summary, in probe order, the value probed under `variable`
    variable: str = "qps"  # or "concurrency"

    @property
    def at_capacity(self) -> dict[str, Any] | None:
        return next((p for p in self.probes if p[self.variable] == self.qps and p["slo_met"]), None)

    @property
    def problem(self) -> str | None:
        """Why `qps` is not a capacity (None when a probe met the SLO and a higher one missed it)."""
        what, unit = ("concurrency", "clients") if self.variable == "concurrency" else ("rate", "QPS")
        if self.qps == 0:
            lowest = min((p[self.variable] for p in self.probes), default=0.0)
            return (f"no {what} met the SLO, down to {lowest:.3g} {unit}: the capacity is below it, or "
                    "nothing meets the SLO")
        if not any(not p["slo_met"] and p[self.variable] > self.qps for p in self.probes):
            return f"no upper bound: every {what} probed, up to {self.qps:.3g} {unit}, met the SLO"
        return None

    @property
    def bound_by(self) -> list[str]:
        """The limits (`SLO.misses`) that the lowest probe above the capacity missed: what bound it (empty
        without such a probe)."""
        above = [p for p in self.probes if not p["slo_met"] and p[self.variable] > self.qps]
        return min(above, key=lambda p: p[self.variable])["slo_missed"] if above else []

    @property
    def warnings(self) -> list[str]:
        """The cost model's warnings (a calibration of another GPU or model), which every probe carries."""
        return list(self.probes[0].get("warnings", [])) if self.probes else []


def search_qps(probe: Callable[[float], dict[str, Any]], slo: SLO, start_qps: float = 1.0,
               rel_tol: float = 0.02, max_probes: int = 30, step: float = 2.0,
               min_qps: float = MIN_QPS) -> CapacityResult:
    """The highest QPS whose run meets `slo`: multiply (or divide) `start_qps` (moved within min_qps..MAX_QPS)
    by `step` until the capacity is bracketed (within those limits), then bisect to `rel_tol`, running at most
    `max_probes` probes.
    `probe(qps)` returns a run's summary; each is kept, with `slo_met` added, in probe order. Simulated runs
    and real runs (validation/validate.py) share it. `CapacityResult.problem` says when no capacity was
    found."""
    probes: list[dict[str, Any]] = []
    ok = _judge(probe, slo, probes, "qps")
    lo, hi = 0.0, min(max(start_qps, min_qps), MAX_QPS)  # from beyond a limit, the probes run out first
    if ok(hi):
        lo = hi
        while len(probes) < max_probes and lo < MAX_QPS:
            hi = min(lo * step, MAX_QPS)
            if not ok(hi):
                break
            lo = hi
    else:
        while len(probes) < max_probes and hi > min_qps:
            hi = max(hi / step, min_qps)
            if ok(hi):
                lo, hi = hi, hi * step
                break
    while lo > 0 and hi - lo > rel_tol * lo and len(probes) < max_probes:
        mid = (lo + hi) / 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return CapacityResult(lo, probes)


def _judge(probe: Callable[[Any], dict[str, Any]], slo: SLO, probes: list[dict[str, Any]], variable: str
           ) -> Callable[[Any], bool]:
    """A function that runs `probe(value)`, keeps its summary in `probes` with the value under `variable`,
    `slo_missed` and `slo_met` added, and says whether it met `slo`."""
    def ok(value: Any) -> bool:
        s = dict(probe(value))
        s[variable] = value
        s["slo_missed"] = slo.misses(s)
        s["slo_met"] = not s["slo_missed"]
        probes.append(s)
        return s["slo_met"]

    return ok


def search_concurrency(probe: Callable[[int], dict[str, Any]], slo: SLO, start: int, most: int,
                       max_probes: int = 30) -> CapacityResult:
    """The highest concurrency (closed-loop clients, 1..`most`) whose run meets `slo`: `start` doubled (or
    halved) until bracketed, then bisected to one client, at most `max_probes` probes. Its probes' summaries
    carry the throughput each concurrency reached."""
    probes: list[dict[str, Any]] = []
    ok = _judge(probe, slo, probes, "concurrency")
    lo, hi = 0, min(max(start, 1), most)
    if ok(hi):
        lo = hi
        while len(probes) < max_probes and lo < most:
            hi = min(lo * 2, most)
            if not ok(hi):
                break
            lo = hi
    else:
        while len(probes) < max_probes and hi > 1:
            missed, hi = hi, max(hi // 2, 1)
            if ok(hi):
                lo, hi = hi, missed
                break
    while lo > 0 and hi - lo > 1 and len(probes) < max_probes:
        mid = (lo + hi) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid
    return CapacityResult(lo, probes, "concurrency")


def probe_summary(config: RunConfig, slo: SLO, cluster: ClusterConfig | None = None) -> dict[str, Any]:
    """One simulated run's summary (on one replica, or the deployment `cluster` describes), with
    `slo_attainment` (the share of requests meeting the SLO's per-request limits, read off the run's requests
    table) when the SLO has such limits."""
    r = run(config, cluster)
    if not slo.per_request:
        return r.summary
    return {**r.summary, "slo_attainment": slo.attainment_of(r.result.request_columns,
                                                            r.summary.get("rejected", 0))}


def find_capacity(config: RunConfig, slo: SLO, start_qps: float = 1.0, rel_tol: float = 0.02,
                  max_probes: int = 60, cluster: ClusterConfig | None = None) -> CapacityResult:
    """The capacity of one simulated configuration (its seed) under `slo`, on one replica or `cluster`: the
    highest rate, or with closed-loop clients (`Workload.concurrency`, the first probed) the highest
    concurrency, up to one client per request."""
    w = config.workload
    if w.concurrency is not None:
        return search_concurrency(lambda n: probe_summary(config.with_workload(concurrency=n), slo, cluster),
                                  slo, w.concurrency, w.num_requests, max_probes)
    return search_qps(lambda qps: probe_summary(config.with_workload(qps=qps), slo, cluster), slo, start_qps,
                      rel_tol, max_probes, min_qps=lowest_qps(config.workload.num_requests))


Job = tuple[int, RunConfig, str, SLO, float, ClusterConfig | None]


@dataclass(frozen=True)
class CapacityConfig:
    """Capacity searches to run side by side: every configuration (one per policy, or per combination of the
    settings compared) under every named SLO, each searched once per seed (`seeds` seeds from the
    configuration's own)."""

    configs: list[RunConfig]
    slos: dict[str, SLO]  # e.g. {"strict": ..., "relaxed": ...} (Table 3), or {"given": the user's}
    start_qps: float = 1.0
    workers: int | None = None  # processes; None: one per core
    seeds: int = 1
    labels: list[str] | None = None  # what names each configuration in a table; None: its policy
    clusters: list[ClusterConfig | None] | None = None  # each configuration's deployment; None: one replica

    @property
    def names(self) -> list[str]:
        return self.labels if self.labels is not None else [c.policy for c in self.configs]

    def validate(self) -> None:
        if not self.configs:
            raise InputError("no policy given")
        names = self.names
        if len(set(names)) != len(names):
            raise InputError(f"a configuration is listed twice: {', '.join(names)}")
        if not self.slos:
            raise InputError("no SLO given")
        # before the configs' own --qps check
        check_start_qps(self.start_qps, self.configs[0].workload.num_requests)
        for c in self.configs:
            c.validate()
        check_probe_requests(self.configs[0].workload.num_requests)
        if not is_int(self.seeds) or not 1 <= self.seeds <= 1000:
            raise InputError(f"--seeds must be an integer from 1 to 1000, got {self.seeds!r}")
        if self.workers is not None and self.workers < 1:
            raise InputError(f"--workers must be >= 1, got {self.workers}")

    def jobs(self) -> list[Job]:
        """One search per configuration (by its index), SLO and seed."""
        clusters = self.clusters or [None] * len(self.configs)
        return [(k, c.with_workload(seed=c.workload.seed + i), name, slo, self.start_qps, clusters[k])
                for k, c in enumerate(self.configs) for name, slo in self.slos.items()
                for i in range(self.seeds)]


@dataclass
class Capacity:
    """One configuration's capacity under one SLO: a search per seed. The capacity is the median over seeds
    (the lower middle one for an even count, so that it is a rate some search found), with its spread."""

    policy: str
    slo_name: str
    slo: SLO
    searches: dict[int, CapacityResult] = field(default_factory=dict)  # seed -> its search
    label: str = ""  # the configuration's name in a table (its policy, or the settings compared)
    config: RunConfig | None = None  # the configuration searched (its first seed)

    @property
    def name(self) -> str:
        return self.label or self.policy

    @property
    def qps(self) -> float:
        return statistics.median_low(r.qps for r in self.searches.values())

    @property
    def qps_min(self) -> float:
        return min(r.qps for r in self.searches.values())

    @property
    def qps_max(self) -> float:
        return max(r.qps for r in self.searches.values())

    @property
    def variable(self) -> str:
        """What was searched: "qps", or with closed-loop clients "concurrency"."""
        return next(iter(self.searches.values())).variable

    @property
    def median_search(self) -> CapacityResult:
        """The search that found the median capacity (the first seed's, if several did)."""
        return next(r for r in self.searches.values() if r.qps == self.qps)

    @property
    def problems(self) -> dict[int, str]:
        """Seed -> why its search found no capacity (see `CapacityResult.problem`)."""
        return {seed: r.problem for seed, r in self.searches.items() if r.problem}

    @property
    def probes(self) -> list[dict[str, Any]]:
        """Every probe of every seed's search, named by policy, SLO and seed."""
        return [{**p, "slo": self.slo_name, "config": self.name} for r in self.searches.values()
                for p in r.probes]

    @property
    def warnings(self) -> list[str]:
        return list(dict.fromkeys(w for r in self.searches.values() for w in r.warnings))


def probe_row(probe: dict[str, Any], drop: tuple[str, ...] = ("warnings",)) -> dict[str, Any]:
    """A probe as a row of probes.parquet: its summary but `drop`, the limits it missed comma-separated
    (`slo_missed`, one string per row as a table's column holds)."""
    return {**{k: v for k, v in probe.items() if k not in drop}, "slo_missed": ",".join(probe["slo_missed"])}


def capacity_warnings(results: list[Capacity]) -> list[str]:
    """Every search's cost-model warnings, each once (the searches share the cost model)."""
    return list(dict.fromkeys(w for r in results for w in r.warnings))


def _search_one(args: Job) -> tuple[int, str, int, CapacityResult]:
    index, config, name, slo, start_qps, cluster = args
    return index, name, config.workload.seed, find_capacity(config, slo, start_qps, cluster=cluster)


def _quiet_worker() -> None:
    """Signals are the parent's business: Ctrl-C reaches the whole process group, and the parent terminates
    its workers (SIGTERM) once it has stopped; a worker just ends, without a traceback."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _indexed(args: tuple[Callable[[Any], Any], int, Any]) -> tuple[int, Any]:
    fn, index, job = args
    return index, fn(job)


def parallel_map(fn: Callable[[Any], Any], jobs: list[Any], workers: int | None,
                 progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """`fn` (a module-level function) over `jobs` in a local process pool of `workers` (None: one per core;
    one: in this process), the results in the jobs' order, `progress` fed (done, jobs) as each ends. On any
    exception, an interruption included, the workers are terminated before it propagates."""
    report = progress or (lambda done, total: None)
    report(0, len(jobs))
    workers = min(workers or os.cpu_count() or 1, len(jobs))
    results: list[Any] = [None] * len(jobs)
    if workers <= 1:
        for i, job in enumerate(jobs):
            results[i] = fn(job)
            report(i + 1, len(jobs))
        return results
    from multiprocessing import Pool

    pool = Pool(workers, initializer=_quiet_worker)
    try:
        for done, (i, r) in enumerate(pool.imap_unordered(_indexed, [(fn, i, j) for i, j in enumerate(jobs)]),
                                      1):
            results[i] = r
            report(done, len(jobs))
        pool.close()
    finally:
        stop_pool(pool)  # bounded: Ctrl-C must not wait on a worker that takes long to die
    return results


def search_capacities(spec: CapacityConfig, progress: Callable[[int, int], None] | None = None
                      ) -> list[Capacity]:
    """Run every search of `spec` (configuration x SLO x seed) in a local process pool (`parallel_map`:
    searches are independent and CPU-bound), `progress` fed (searches done, searches); one `Capacity` per
    configuration and SLO, in the order given."""
    found = {(p, n, seed): r for p, n, seed, r in parallel_map(_search_one, spec.jobs(), spec.workers,
                                                                progress)}
    return [Capacity(c.policy, name, slo, {(seed := c.workload.seed + i): found[(k, name, seed)]
                                           for i in range(spec.seeds)}, label, c)
            for k, (c, label) in enumerate(zip(spec.configs, spec.names)) for name, slo in spec.slos.items()]


def table3_slos_for(config: RunConfig, sched_delay_p50_s: float = DEFAULT_SCHED_DELAY_P50_S
                    ) -> tuple[dict[str, SLO], float]:
    """Sarathi-Serve's strict and relaxed SLOs for `config`'s model, GPU, TP and cost model, with the decode
    iteration time they scale (`simctl.results.slo.table3_decode_time`)."""
    cost = cost_model(config.cost, get_model(config.model), get_gpu(config.gpu), config.tp,
                      config.routing_skew, config.ep, config.allreduce, config.pp)[0]
    return table3_slos(cost, sched_delay_p50_s), table3_decode_time(cost)
