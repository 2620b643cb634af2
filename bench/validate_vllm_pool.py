"""Pool several `bench/validate_vllm.py` runs of one fit (same twin, same requests, same loads): each load's
real runs of all of them together, their medians against the twin, raw and at the machine's speed (the twin
scaled by the median of those runs' speed factors), and the runs made at the fit's speed (factor within
`FIT_SPEED_TOL` of 1) against the raw twin. With `--scales`, also how steep each load is in the cost: the P50
errors of the twin with its cost scaled by each factor (a diagnostic, never a correction).

    .venv/bin/python bench/validate_vllm_pool.py OUT1/validation OUT2/validation ... [--scales 0.97,1,1.03]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

SHOWN = ("ttft_p50", "tpot_p50", "tbt_p50", "e2e_p50", "ttft_p99", "tpot_p99", "tbt_p99", "e2e_p99")


Load = tuple[float, float, list[dict], list[float | None]]


def pooled(dirs: list[Path]) -> tuple[dict[str, Any], list[Load]]:
    """The first report's config and, per load: (load, qps, every real run's summary, each one's speed factor,
    None where a run had none)."""
    from simctl.validation.pipeline import real_dirs

    reports = [json.loads((d / "validation_vllm.json").read_text(encoding="utf-8")) for d in dirs]
    cfg = reports[0]["config"]
    if any(r["config"]["cost"] != cfg["cost"] or r["capacity"]["sim_qps"] != reports[0]["capacity"]["sim_qps"]
           for r in reports):
        print("the validations differ in their fit or twin", file=sys.stderr)
        sys.exit(2)
    loads = []
    for i, row in enumerate(reports[0]["rows"]):
        runs, speeds = [], []
        for d, r in zip(dirs, reports):
            for k, speed in enumerate(r["speed_factors"][i::len(r["rows"])]):  # round k's run at this load
                summary = real_dirs(d / "runs" / f"load_{row['load']:g}", k + 1)[k] / "summary.json"
                runs.append(json.loads(summary.read_text(encoding="utf-8")))
                speeds.append(speed)
        loads.append((row["load"], row["qps"], runs, speeds))
    cfg["real_capacities"] = [r["capacity"].get("real_qps") for r in reports]
    cfg["sim_qps"] = reports[0]["capacity"]["sim_qps"]
    cfg["runs"] = sum(r["config"]["repeats"] for r in reports)
    return cfg, loads


def main() -> None:
    from simctl.catalogue.models import get_model
    from simctl.costs.base import ScaledCost
    from simctl.costs.loader import load_cost
    from simctl.results.validation_report import pct_error
    from simctl.traces.workload import Workload
    from simctl.validation.pipeline import FIT_SPEED_TOL
    from simctl.validation.vllm_validate import simulate_requests

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="+", type=Path)
    ap.add_argument("--scales", default="", help="comma list of cost factors for the steepness table")
    a = ap.parse_args()
    cfg, loads = pooled(a.dirs)
    cost = load_cost(cfg["cost"], get_model(cfg["model"]), None).cost
    workload = Workload.of_record(cfg)

    def twin(qps: float, factor: float) -> dict[str, Any]:
        return simulate_requests(workload.at(qps).requests(), cfg["engine"], ScaledCost(cost, factor))[0]

    print(f"Pooled: {len(a.dirs)} validations of {cfg['cost']}, {cfg['runs']} real runs per load.\n")
    print("| load | metric | real median (runs) | real min..max | sim | error | speed factor (median) | "
          "error at machine speed | runs at the fit's speed: median, error |\n"
          "|---|---|---|---|---|---|---|---|---|")
    for load, qps, runs, speeds in loads:
        sim, speed = twin(qps, 1.0), statistics.median(s for s in speeds if s is not None)
        scaled = twin(qps, speed)
        matched = [r for r, s in zip(runs, speeds, strict=True)
                   if s is not None and abs(s - 1) <= FIT_SPEED_TOL]
        for m in SHOWN:
            values = [s[m] for s in runs]
            real = statistics.median(values)
            at_fit = statistics.median(r[m] for r in matched) if matched else None
            fit_cell = (f"{at_fit * 1e3:.1f} ms ({len(matched)}), {pct_error(sim[m], at_fit):+.1f}%"
                        if at_fit is not None else "no run")
            print(f"| {load:g} | {m} | {real * 1e3:.1f} ms ({len(values)}) | {min(values) * 1e3:.1f}.."
                  f"{max(values) * 1e3:.1f} ms | {sim[m] * 1e3:.1f} ms | {pct_error(sim[m], real):+.1f}% | "
                  f"{speed:.3f} | {pct_error(scaled[m], real):+.1f}% | {fit_cell} |")
    caps = ", ".join(f"{c:.4g}" for c in cfg["real_capacities"] if c)
    print(f"\nReal capacities: {caps} QPS; twin {cfg['sim_qps']:.4g} QPS.")
    if a.scales:
        print("\nP50 errors (TTFT / TPOT / ITL / E2E) of the twin with its cost scaled by each factor:\n\n"
              "| load | factor | errors |\n|---|---|---|")
        for load, qps, runs, _ in loads:
            for factor in (float(x) for x in a.scales.split(",")):
                sim = twin(qps, factor)
                errs = [pct_error(sim[m], statistics.median(s[m] for s in runs)) for m in SHOWN[:4]]
                print(f"| {load:g} | {factor:g} | {' / '.join(f'{e:+.1f}%' for e in errs)} |")


if __name__ == "__main__":
    main()
