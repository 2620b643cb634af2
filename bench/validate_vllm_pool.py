"""Pool several `bench/validate_vllm.py` runs of one fit (same twin, same requests, same loads): each load's
real runs of all of them together, their medians against the twin, raw and at the machine's speed (the twin
scaled by the median of those runs' speed factors).

    .venv/bin/python bench/validate_vllm_pool.py OUT1/validation OUT2/validation ... > pooled.md
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SHOWN = ("ttft_p50", "tpot_p50", "tbt_p50", "e2e_p50", "ttft_p99", "tpot_p99", "tbt_p99", "e2e_p99")


def main() -> None:
    sys.path.insert(0, str(ROOT))
    from costs.base import ScaledCost
    from results.validation_report import pct_error
    from validation.twin import load_cost
    from validation.vllm_validate import VLLMValidation, Workload, simulate_requests

    dirs = [Path(d) for d in sys.argv[1:]]
    if not dirs:
        print("usage: validate_vllm_pool.py VALIDATION_DIR...", file=sys.stderr)
        sys.exit(2)
    reports = [json.loads((d / "validation_vllm.json").read_text(encoding="utf-8")) for d in dirs]
    cfg = reports[0]["config"]
    if any(r["config"]["cost"] != cfg["cost"] or r["capacity"]["sim_qps"] != reports[0]["capacity"]["sim_qps"]
           for r in reports):
        print("the validations differ in their fit or twin", file=sys.stderr)
        sys.exit(2)
    cost = load_cost(cfg["cost"], cfg["model"])
    workload = Workload(VLLMValidation(cost=cost, model=cfg["model"], trace=cfg["trace"], scale=cfg["scale"],
                                       num_requests=cfg["num_requests"], seed=cfg["seed"]))
    settings = cfg["engine"]
    loads = [row["load"] for row in reports[0]["rows"]]
    print(f"Pooled: {len(dirs)} validations of {cfg['cost']}, {sum(r['config']['repeats'] for r in reports)} "
          "real runs per load.\n")
    print("| load | metric | real median (runs) | real min..max | sim | error | speed factor (median) | "
          "error at machine speed |\n|---|---|---|---|---|---|---|---|")
    for i, (load, row) in enumerate(zip(loads, reports[0]["rows"])):
        runs, speeds = [], []
        for d, r in zip(dirs, reports):
            n = len(r["rows"])
            speeds += r["speed_factors"][i::n]
            runs += [json.loads(p.read_text(encoding="utf-8"))
                     for p in sorted((d / "runs" / f"load_{load:g}").glob("real*/summary.json"))]
        requests = workload.at(row["qps"])
        sim = simulate_requests(requests, settings, cost)[0]
        speed = statistics.median(speeds)
        scaled = simulate_requests(requests, settings, ScaledCost(cost, speed))[0]
        for m in SHOWN:
            values = [s[m] for s in runs]
            real = statistics.median(values)
            print(f"| {load:g} | {m} | {real * 1e3:.1f} ms ({len(values)}) | {min(values) * 1e3:.1f}.."
                  f"{max(values) * 1e3:.1f} ms | {sim[m] * 1e3:.1f} ms | {pct_error(sim[m], real):+.1f}% | "
                  f"{speed:.3f} | {pct_error(scaled[m], real):+.1f}% |")
    caps = [r["capacity"].get("real_qps") for r in reports]
    print(f"\nReal capacities: {', '.join(f'{c:.4g}' for c in caps if c)} QPS; twin "
          f"{reports[0]['capacity']['sim_qps']:.4g} QPS.")


if __name__ == "__main__":
    main()
