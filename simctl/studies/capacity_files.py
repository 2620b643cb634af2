"""What `simctl capacity --out` writes, all or none (`results.output.write_files`): capacity.json (the SLOs,
one row per policy and SLO with the capacity's median and spread over seeds, where a search found none and
why, the cost model's warnings and the configuration), probes.parquet (every probed run: its summary, named by
policy, SLO and seed, with `slo_met`) and capacity.png."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd
from matplotlib.figure import Figure

from simctl.results.output import json_text, write_files
from simctl.studies.capacity import Capacity, CapacityConfig, capacity_warnings, probe_row

CAPACITY_FILES = ("probes.parquet", "capacity.png", "capacity.json")
SETUP_KEYS = ("trace", "model", "gpu", "tp")


def capacity_rows(spec: CapacityConfig, results: list[Capacity]) -> list[dict[str, Any]]:
    """One row per policy and SLO: the median capacity over seeds (`capacity_qps`, or closed loop
    `capacity_concurrency`), its spread, each seed's."""
    def setup(r: Capacity) -> dict[str, Any]:
        c = r.config or spec.configs[0]
        named = c.recorded()
        return {**{k: named[k] for k in SETUP_KEYS}, "options": {k: v for k, v in c.options.items()
                                                                       if v is not None}}

    return [{"policy": r.policy, "config": r.name, **setup(r), "slo": r.slo_name,
             "slo_text": r.slo.describe(),
             "capacity_definition": r.slo.definition,
             **_capacity(r),
             "bound_by": r.median_search.bound_by,
             "probes": sum(len(s.probes) for s in r.searches.values()),
             "rejected_at_capacity": (r.median_search.at_capacity or {}).get("rejected", 0),
             "problems": {str(seed): p for seed, p in r.problems.items()}}
            for r in results]


def _capacity(r: Capacity) -> dict[str, Any]:
    """The median capacity, its spread and each seed's, named by what was searched (capacity_qps, or
    capacity_concurrency with the throughput it reached)."""
    key = f"capacity_{r.variable}"
    found = {key: r.qps, f"{key}_min": r.qps_min, f"{key}_max": r.qps_max,
             f"{key}_by_seed": {str(seed): s.qps for seed, s in r.searches.items()}}
    if r.variable == "concurrency":
        found["throughput_rps_at_capacity"] = (r.median_search.at_capacity or {}).get("throughput_rps")
    return found


def probes_frame(results: list[Capacity]) -> pd.DataFrame:
    """Every probe of every search (the run's summary, `qps`, `slo_met`, the limits it missed as
    `slo_missed`, comma-separated, and the SLO's name as `slo`); the cost model's warnings, the same in every
    probe, are in capacity.json."""
    return pd.DataFrame([probe_row(p) for r in results for p in r.probes])


def write_capacity(out: Path, spec: CapacityConfig, results: list[Capacity], slo_origin: str,
                   figure: Figure) -> None:
    """capacity.json, probes.parquet and capacity.png (`figure`, closed once written) into `out`, all or none;
    `slo_origin` says where the SLOs came from (given, or derived by Sarathi-Serve's Table 3 rule)."""
    import matplotlib.pyplot as plt

    probes = probes_frame(results)
    text = json_text({
        "slos": {name: {**slo.to_dict(), "text": slo.describe()} for name, slo in spec.slos.items()},
        "slo_origin": slo_origin, "seeds": spec.seeds, "capacity": capacity_rows(spec, results),
        "warnings": capacity_warnings(results),
        "config": {k: v for k, v in asdict(spec.configs[0]).items()
                   if k not in ("policy", "qps", "fast", "seed")}
        | {"first_seed": spec.configs[0].workload.seed}})
    try:
        write_files(Path(out), {
            "probes.parquet": lambda p: probes.to_parquet(p, index=False),
            "capacity.png": lambda p: figure.savefig(p, dpi=110, format="png"),
            "capacity.json": lambda p: p.write_text(text, encoding="utf-8"),
        }, "the capacity files")
    finally:
        plt.close(figure)
