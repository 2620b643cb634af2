"""One validation point: finished real runs (repeats of one run) against the simulator on identical requests,
their iterations replayed and re-priced (`validation.replay`), as a report row, its per-iteration evidence and
the CDF data (`simctl.results.validation_report.RunPair`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simctl.costs.base import CostModel, ScaledCost
from simctl.results.output import atomic_write, write_run
from simctl.results.validation_report import METRICS, RunPair, pct_error
from simctl.studies.capacity import SLO
from simctl.validation.replay import iteration_evidence, merge_replays, replay_real
from simctl.validation.twin import simulate_twin


def compare_run(policy: str, load: float, value: float, sim_capacity: float, reals: list[Path], run_dir: Path,
                cost: CostModel, slo: SLO, foreign: float | None = None,
                variable: str = "qps") -> tuple[dict[str, Any], dict[str, Any], RunPair]:
    """Finished real runs (their folders `reals`: repeats of one run at `value` of `variable`, a rate or a
    concurrency) against the simulator on identical requests: writes `run_dir/sim/` and
    `run_dir/replay.parquet`; returns (report row, per-iteration evidence, CDF data). A measured metric is the
    median over the repeats."""
    summaries = [json.loads((d / "summary.json").read_text(encoding="utf-8")) for d in reals]
    sim, result = simulate_twin(summaries[0], cost)
    sim_its = result.iterations.frame()
    write_run(run_dir / "sim", sim, result.requests, sim_its)
    real_reqs = [pd.read_parquet(d / "requests.parquet") for d in reals]
    reps, tbt_matches = [], []
    for d, real in zip(reals, summaries):
        rep = replay_real(real, pd.read_parquet(d / "iterations.parquet"), cost,
                          pd.read_parquet(d / "requests.parquet"))
        tbt_matches.append(rep.matched == rep.total and all(
            v is not None and real[k] is not None and math.isclose(v, real[k], rel_tol=1e-9)
            for v, k in zip(rep.gaps.percentiles((50, 99)), ("tbt_p50", "tbt_p99"))))
        reps.append(rep)
    rep = merge_replays(reps)
    atomic_write(run_dir / "replay.parquet", lambda p: rep.frame.to_parquet(p, index=False))
    forward = [s.get("forward_s_total") for s in summaries]
    ev = iteration_evidence(rep, None if None in forward else float(sum(forward)), sim_its, len(reals))
    ev["replay_tbt_matches"] = all(tbt_matches)
    row: dict[str, Any] = {"policy": policy, "load": load, variable: value,
                           f"sim_capacity_{variable}": sim_capacity, "repeats": len(reals)}
    for m in METRICS:
        measured = [s.get(m) for s in summaries]
        known = [v for v in measured if v is not None and math.isfinite(v)]
        row[f"{m}_real"] = float(np.median(known)) if len(known) == len(measured) else None
        row[f"{m}_real_min"] = min(known) if known else None
        row[f"{m}_real_max"] = max(known) if known else None
        row[f"{m}_sim"] = sim.get(m)
        row[f"{m}_err_pct"] = pct_error(sim.get(m), row[f"{m}_real"])
    # the same simulation on a machine as fast as the real runs were (their measured / repriced busy time):
    # what remains is the scheduling and queueing model's error, not the machine's drift since the profile
    speed = ev["busy_ratio_real_over_repriced"]
    adjusted = simulate_twin(summaries[0], ScaledCost(cost, speed))[0] if speed else {}
    for m in METRICS:
        row[f"{m}_adj_err_pct"] = pct_error(adjusted.get(m), row[f"{m}_real"])
    row.update({
        "identical_requests": all(_same_requests(r, result.requests) for r in real_reqs),
        "real_completed": min(s["completed"] for s in summaries), "sim_completed": sim["completed"],
        "real_sustainable": all(s["sustainable"] for s in summaries), "sim_sustainable": sim["sustainable"],
        "real_slo_met": 2 * sum(slo.met(s) for s in summaries) > len(summaries),  # by most repeats
        "sim_slo_met": slo.met(sim),
        "real_iterations": float(np.median([s["iterations"] for s in summaries])),
        "sim_iterations": sim["iterations"],
        "busy_ratio_real_over_repriced": ev["busy_ratio_real_over_repriced"],
        "busy_ratio_real_over_sim": ev["busy_ratio_real_over_sim"],
        "real_between_mean_ms": (ev["real_between_mean_s"] * 1e3 if ev["real_between_mean_s"] is not None
                                 else None),
        "replay_matched": f"{rep.matched}/{rep.total}",
        "foreign_cpu_share": foreign,
        "real_wall_s": float(np.median([s.get("real_wall_s") or 0.0 for s in summaries])),
    })
    pair = RunPair(policy, load, np.concatenate([_ttft(r) for r in real_reqs]), _ttft(result.requests),
                   rep.gaps, result.gaps, rep.matched == rep.total)
    return row, {"policy": policy, "load": load, **ev}, pair


def _same_requests(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    if len(a) != len(b):
        return False
    a = a.sort_values("request_id")[cols].reset_index(drop=True)
    b = b.sort_values("request_id")[cols].reset_index(drop=True)
    return bool(a.equals(b))


def _ttft(req: pd.DataFrame) -> np.ndarray:
    done = req[req["first_token_s"] >= 0]
    return (done["first_token_s"] - done["arrival_s"]).to_numpy()
