"""A sweep file (TOML) and the points of its grid: what `simctl sweep SWEEP.toml` runs.

```toml
mode = "run"                 # "run": one simulation per point at each `qps`; "capacity": a search per point
num_requests = 1000
seeds = [0]                  # each point once per seed
[grid]                       # every combination of these lists
policy = ["vllm", "sarathi"]
trace = ["sharegpt", "arxiv"]
qps = [0.5, 1.0, 2.0]        # run mode only
token_budget = [512, 2048]   # a policy setting: applied to the policies that take it, ignored by the others
replicas = [1, 4]            # replicas behind a router (`router = [...]`, default round-robin); a capacity
                             # point then reports the rate per GPU too
# disaggregated: prefill_instances, decode_instances, kv_link_gbps, and optionally prefill_gpu, decode_gpu,
# prefill_tp, decode_tp (the `run` options of those names)
[slo]                        # named SLOs in simctl's --slo grammar; a run point is judged against each
strict = "p99_tbt=0.1"
relaxed = "p99_tbt=0.5"
```

Every value is checked, and every point validated, before anything runs: an unknown field, an empty list, a
bad value or a point a run would refuse is one InputError naming it. Each point has a key: the hash of its
full configuration (mode, run configuration with the policy's settings, SLOs, search start), which names its
cached result (`studies/sweep.py`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.common.files import read_text
from simctl.policies.registry import setting_names
from simctl.results.slo import SLO, parse_slo
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig
from simctl.studies.capacity import check_probe_requests, check_start_qps
from simctl.traces.workload import Workload

MODES = ("run", "capacity")
RUN_FIELDS = ("policy", "trace", "model", "gpu", "tp", "qps")  # grid fields that are RunConfig fields
CLUSTER_FIELDS = ("replicas", "router", "prefill_instances", "decode_instances", "prefill_gpu", "decode_gpu",
                  "prefill_tp", "decode_tp", "kv_link_gbps")  # grid fields that are ClusterConfig fields
TOP_FIELDS = {"mode": str, "num_requests": int, "seeds": list, "start_qps": (int, float), "arrival": str,
              "cv": (int, float), "scale": (int, float), "cost": str, "attainment": (int, float),
              "max_sched_delay_p50": (int, float), "grid": dict, "slo": dict, "max_model_len": int,
              "on_too_long": str}
DEFAULTS = RunConfig()
WORKLOAD_FIELDS = {f.name for f in fields(Workload)}
# part of every key: a change to what a point computes must not reuse older results (2: the roofline's
# defaults of issue 39, its host terms, the H100's and H200's mbu and vLLM's all-reduce)
POINT_FORMAT = 2


@dataclass(frozen=True)
class SweepPoint:
    mode: str
    config: RunConfig
    slos: dict[str, SLO]  # run mode: every SLO of the file; capacity mode: the one searched
    start_qps: float
    labels: dict[str, Any] = field(default_factory=dict)  # the grid values that name it in the table
    cluster: ClusterConfig = field(default_factory=ClusterConfig)  # one replica: `simctl.sim.run.run`

    @property
    def key(self) -> str:
        full = {"format": POINT_FORMAT, "mode": self.mode,
                # the recorded settings: options given only (keys from before MoE kept)
                "config": {**self.config.recorded(), "options": self.config.options},
                "slos": {name: slo.to_dict() for name, slo in self.slos.items()}, "start_qps": self.start_qps}
        if self.cluster.is_cluster:  # (single-replica points keep the keys they had before clusters)
            full["cluster"] = self.cluster.recorded(self.config.tp)
        text = json.dumps(full, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:20]


def _list(grid: dict[str, Any], name: str) -> list[Any]:
    values = grid[name]
    if not isinstance(values, list):
        values = [values]
    if not values:
        raise InputError(f"sweep grid: {name} is an empty list; give at least one value")
    if len(set(map(repr, values))) != len(values):
        raise InputError(f"sweep grid: {name} lists a value twice: {values}")
    return values


def _check_type(where: str, value: Any, kind: type | tuple[type, ...]) -> None:
    if isinstance(value, bool) or not isinstance(value, kind):
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise InputError(f"sweep file: {where} must be {names}, got {value!r}")


def read_sweep(path: Path) -> dict[str, Any]:
    text = read_text(path, f"sweep file {path}")
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise InputError(f"sweep file {path}: not valid TOML ({e})") from None


def _slos(spec: dict[str, Any]) -> dict[str, SLO]:
    attainment = spec.get("attainment")
    delay = spec.get("max_sched_delay_p50", 2.0)
    slos = {}
    for name, text in spec.get("slo", {}).items():
        _check_type(f"slo.{name}", text, str)
        try:
            slos[name] = parse_slo([text], attainment if _per_request(text) else None, delay)
        except InputError as e:
            raise InputError(f"sweep file: slo.{name}: {e}") from None
    return slos


def _per_request(text: str) -> bool:
    return any(item.split("=")[0].strip() in ("ttft", "tbt", "tpot", "e2e") for item in text.split(","))


def sweep_points(spec: dict[str, Any]) -> list[SweepPoint]:
    """Every point of the grid, each validated; duplicates (a setting a policy does not take) collapse."""
    unknown = sorted(set(spec) - set(TOP_FIELDS))
    if unknown:
        raise InputError(f"sweep file: unknown field {unknown[0]!r}; known: {', '.join(TOP_FIELDS)}")
    for name, kind in TOP_FIELDS.items():
        if name in spec:
            _check_type(name, spec[name], kind)
    mode = spec.get("mode", "run")
    if mode not in MODES:
        raise InputError(f"sweep file: mode {mode!r}; give one of {', '.join(MODES)}")
    options = setting_names()
    grid = spec.get("grid", {})
    unknown = sorted(set(grid) - set(RUN_FIELDS) - set(CLUSTER_FIELDS) - set(options))
    if unknown:
        raise InputError(f"sweep grid: unknown field {unknown[0]!r}; known: "
                         f"{', '.join((*RUN_FIELDS, *CLUSTER_FIELDS, *options))}")
    if not grid:
        raise InputError("sweep file: the grid is empty; give [grid] with at least policy = [...]")
    if (mode == "run") != ("qps" in grid):
        raise InputError("sweep file: a run sweep needs grid.qps (requests per second), a capacity sweep "
                         "searches the rate itself and takes none")
    slos = _slos(spec)
    if mode == "capacity" and not slos:
        raise InputError("sweep file: a capacity sweep needs at least one SLO ([slo] name = \"p99_tbt=0.1\")")
    seeds = spec.get("seeds", [0])
    for s in seeds:
        _check_type("seeds", s, int)
    base = {"num_requests": spec.get("num_requests", DEFAULTS.workload.num_requests),
            **{k: spec[k] for k in ("arrival", "cv", "scale", "cost", "max_model_len", "on_too_long")
               if k in spec}}
    start_qps = float(spec.get("start_qps", 1.0))
    names = list(grid)
    points: dict[str, SweepPoint] = {}
    for values in itertools.product(*(_list(grid, n) for n in names)):
        chosen = dict(zip(names, values))
        policy = chosen.get("policy", DEFAULTS.policy)
        takes = {k: v for k, v in chosen.items() if k in options and policy in options[k]}
        run_fields = {k: v for k, v in chosen.items() if k in RUN_FIELDS}
        cluster = ClusterConfig(**{k: v for k, v in chosen.items() if k in CLUSTER_FIELDS})
        for seed in seeds:
            given = {**base, **run_fields, "seed": seed}
            config = replace(DEFAULTS, **{k: v for k, v in given.items() if k not in WORKLOAD_FIELDS},
                             options=takes,
                             workload=replace(DEFAULTS.workload, **{k: v for k, v in given.items()
                                                                    if k in WORKLOAD_FIELDS}))
            named = config.recorded()
            labels = {**{k: named[k] for k in ("policy", "trace", "model", "gpu", "tp", "seed")},
                      **{k: getattr(cluster, k) for k in CLUSTER_FIELDS if k in grid},
                      **{k: takes.get(k) for k in options if k in grid},
                      "variant": " ".join([policy, *(f"{k}={v}" for k, v in takes.items())])}
            for slo_set in ([slos] if mode == "run" else [{n: s} for n, s in slos.items()]):
                point = SweepPoint(mode, config, slo_set, start_qps, labels, cluster)
                points.setdefault(point.key, point)
    checked: set[tuple[str, str]] = set()
    for point in points.values():
        _validate(point, checked)
    return list(points.values())


def _validate(point: SweepPoint, checked: set[tuple[str, str]]) -> None:
    c = point.config
    where = ", ".join(f"{k}={v}" for k, v in point.labels.items())
    try:
        if point.mode == "capacity":
            check_start_qps(point.start_qps, c.workload.num_requests)
            c = c.with_workload(qps=point.start_qps)
            check_probe_requests(c.workload.num_requests)
        c.validate()
        point.cluster.validate(c.policy)
        if (c.model, c.gpu) not in checked:
            get_model(c.model), get_gpu(c.gpu)
            checked.add((c.model, c.gpu))
    except InputError as e:
        raise InputError(f"sweep point ({where}): {e}") from None
