"""The steps of a vLLM validation's real runs at one load beside its twin's, raw and at a speed factor: how
many steps, decode rows and prefill tokens per step, step periods (end to end) and the largest request gaps.

    .venv/bin/python research/vllm_step_shapes.py VALIDATION_DIR [--load 0.9] [--factor 1.07] [--runs 4]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd


def describe(name: str, it: pd.DataFrame, requests: pd.DataFrame) -> str:
    """One line: the run's steps (a twin's stretch row expanded into its iterations, each its share of the
    row's time: a stretch's repeats differ little)."""
    repeat = np.concatenate([np.arange(n) for n in it["count"]])
    it = it.loc[it.index.repeat(it["count"])].reset_index(drop=True)
    share = it.duration_s / it["count"]
    ends = (it.start_s + share * (repeat + 1)).to_numpy()
    period_ms = np.diff(ends) * 1e3
    fills = it.prefill_tokens
    return (f"| {name} | {len(it)} | {it.decode_tokens.mean():.1f} / {it.decode_tokens.max()} | "
            f"{fills.mean():.0f} / {np.percentile(fills, 90):.0f} / {fills.max()} | "
            f"{np.median(period_ms):.1f} / {np.percentile(period_ms, 99):.1f} ms | "
            f"{np.percentile(requests.max_tbt_s, 99) * 1e3:.1f} ms | {int(requests.preemptions.sum())} |")


def main() -> None:
    from simctl.catalogue.models import get_model
    from simctl.costs.base import ScaledCost
    from simctl.costs.loader import load_cost
    from simctl.traces.workload import Workload
    from simctl.validation.vllm_validate import simulate_requests

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("validation", type=Path)
    ap.add_argument("--load", type=float, default=0.9)
    ap.add_argument("--factor", type=float, default=1.0)
    ap.add_argument("--runs", type=int, default=4)
    a = ap.parse_args()
    report = json.loads((a.validation / "validation_vllm.json").read_text(encoding="utf-8"))
    cfg = report["config"]
    cost = load_cost(cfg["cost"], get_model(cfg["model"]), None).cost
    (row,) = [r for r in report["rows"] if r["load"] == a.load]
    requests = Workload.of_record(cfg).at(row["qps"]).requests()
    print("| run | steps | decode rows mean / max | prefill tokens per step mean / P90 / max | period P50 / "
          "P99 | P99 of requests' longest gap | preemptions |\n|---|---|---|---|---|---|---|")
    for factor in sorted({1.0, a.factor}):
        result = simulate_requests(requests, cfg["engine"], ScaledCost(cost, factor))[1]
        print(describe(f"twin x{factor:g}", result.iterations.frame(), result.requests))
    for d in sorted((a.validation / "runs" / f"load_{a.load:g}").glob("real*"))[:a.runs]:
        frames = (pd.read_parquet(d / f"{name}.parquet") for name in ("iterations", "requests"))
        print(describe(d.name, *frames))


if __name__ == "__main__":
    main()
