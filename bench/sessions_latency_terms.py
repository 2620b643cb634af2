"""Where the twin's session latencies part from vLLM's (issue 37, target (a), item 3): reads the real runs
`bench/sessions_vllm_latency.py` wrote (`--runs`) and splits each run's latencies into the terms the records
hold, beside the twin's at that run's machine speed (the speed factor the run recorded):

- sched delay: send to the first step that scheduled the request (queueing, the scheduler, the front end);
- prefill: first scheduled step to the first token (the prefill step's cost, or its chunks);
- decode: first token to completion over the tokens after the first (the decode steps' cost, batch mixes);
- steps: how many engine steps the run took and their mean duration, steps with prefill tokens apart from
  decode-only ones (the step-cost term on its own, per kind of step);
- the twin with the machine's slowdown added per step instead of multiplied (`AddedCost`: each step its fitted
  price plus the same share of the time the run's factor adds in all; the front end's admission unchanged):
  its P50s beside the real medians, which says whether the proportional scaling is what misses;
- think: a session's later turn is sent its think_s after its predecessor completed, or later when no
  client is free: the gap minus think_s (its minimum: the front end's own delay, with a client free).

    PYTHONPATH=. .venv/bin/python bench/sessions_latency_terms.py --runs out/sessions-latency --cost FIT \\
        [the workload options sessions_vllm_latency.py ran with]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from sessions_vllm_latency import workload

from simctl.catalogue.models import get_model
from simctl.costs.base import CostModel, ScaledCost
from simctl.costs.loader import load_cost
from simctl.policies.plan import BatchPlan
from simctl.validation.vllm_validate import VLLMValidation, simulate_requests


def terms(req: pd.DataFrame, it: pd.DataFrame, think: dict[int, tuple[int, float]]) -> dict[str, float]:
    """A run's medians of each latency term, its steps, and the think-time gap (send - predecessor's
    completion - think_s) of the later turns."""
    done = req.set_index("request_id")["completion_s"]
    sent = req.set_index("request_id")["arrival_s"]
    gaps = [sent[i] - done[p] - k for i, (p, k) in think.items() if i in sent.index and p in done.index]
    decode = (req["completion_s"] - req["first_token_s"]) / (req["output_tokens"] - 1).clip(lower=1)
    return {"ttft": float((req["first_token_s"] - req["arrival_s"]).median()),
            "sched": float((req["first_scheduled_s"] - req["arrival_s"]).median()),
            "prefill": float((req["first_token_s"] - req["first_scheduled_s"]).median()),
            "decode_per_token": float(decode.median()),
            "e2e": float((req["completion_s"] - req["arrival_s"]).median()),
            **step_terms(it), "makespan_s": float(req["completion_s"].max()),
            "preemptions": float(req["preemptions"].sum()),
            "think_gap_min_ms": float(np.min(gaps) * 1e3) if gaps else float("nan"),
            "think_gap_p50_ms": float(np.median(gaps) * 1e3) if gaps else float("nan")}


def step_terms(it: pd.DataFrame) -> dict[str, float]:
    """Steps (a row of `count` identical steps counts `count` times: the twin coalesces decode runs), their
    busy time, and the mean step by kind: with prefill tokens, and decode only."""
    count = it["count"] if "count" in it else pd.Series(1, index=it.index)
    prefill = it["prefill_tokens"] > 0
    out = {"steps": float(count.sum()), "busy_s": float(it["duration_s"].sum()),
           "mean_batch": float((it["batch_size"] * count).sum() / count.sum())}
    for kind, rows in (("prefill_step_ms", prefill), ("decode_step_ms", ~prefill)):
        out[kind] = float(it.loc[rows, "duration_s"].sum() / count[rows].sum() * 1e3)
    out["prefill_tokens_per_step"] = float(it.loc[prefill, "prefill_tokens"].sum() / count[prefill].sum())
    return out


class AddedCost(CostModel):
    """`base`'s times plus `gap` seconds per step: a machine whose slowdown is host time between steps."""

    def __init__(self, base: CostModel, gap: float) -> None:
        self.base, self.gap = base, gap

    def iteration_time(self, plan: BatchPlan) -> float:
        return self.base.iteration_time(plan) + self.gap

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        return self.base.stretch_times(plan, k) + self.gap

    def assumptions(self) -> dict[str, Any]:
        return {**self.base.assumptions(), "added_per_step_s": self.gap}

    @property
    def admission_s(self) -> float:
        return self.base.admission_s


def added_twins(requests: list[Any], settings: dict[str, Any], cost: CostModel, clients: dict[str, Any],
                row: dict[str, Any]) -> dict[str, float]:
    """The medians over a concurrency's runs of the twin with each run's slowdown added per step (the time
    factor f adds to the twin's run, (f - 1) x its busy time, spread evenly over its steps)."""
    _, result = simulate_requests(requests, settings, cost, **clients)
    it = result.iterations.frame()
    per_step = it["duration_s"].sum() / it["count"].sum()
    runs = [simulate_requests(requests, settings, AddedCost(cost, (f - 1) * per_step), **clients)[0]
            for f in row["speeds"]]
    return {m: float(np.median([r[m] for r in runs])) for m in ("ttft_p50", "tbt_p50", "e2e_p50")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--cost", required=True)
    for name, kind, default in (("--num-requests", int, 300), ("--qps", float, 100.0),
                                ("--scale", float, 0.25), ("--system-prompt-tokens", int, 1024),
                                ("--system-prompts", int, 4), ("--session-think-time", float, 1.0),
                                ("--seed", int, 0)):
        p.add_argument(name, type=kind, default=default)
    args = p.parse_args()
    saved = json.loads((args.runs / "rows.json").read_text())
    cost, settings = load_cost(args.cost, get_model("tiny"), None).cost, saved["settings"]
    out: list[dict[str, Any]] = []
    for row in saved["rows"]:
        n = row["concurrency"]
        v = VLLMValidation(cost=cost, workload=workload(args, n))
        requests = v.requests_at(args.qps)
        think = {r.id: (r.previous, r.think_s) for r in requests if r.previous >= 0}
        for k, speed in enumerate(row["speeds"]):
            where = args.runs / f"c{n}" / "runs" / "load_1" / ("real" if k == 0 else f"real_{k + 1}")
            real = terms(pd.read_parquet(where / "requests.parquet"),
                         pd.read_parquet(where / "iterations.parquet"), think)
            _, result = simulate_requests(requests, settings, ScaledCost(cost, speed), **v.clients)
            twin = terms(result.requests, result.iterations.frame(), think)
            out.append({"concurrency": n, "run": k + 1, "speed": speed, "real": real, "twin": twin})
            print(f"c={n} run {k + 1} speed {speed:.2f}: " + ", ".join(
                f"{t} {real[t]:.4g}/{twin[t]:.4g}" for t in real), flush=True)
        added = added_twins(requests, settings, cost, v.clients, row)
        out.append({"concurrency": n, "added_per_step": added,
                    "error_pct": {m: 100 * (x / row[f"real_{m}"] - 1) for m, x in added.items()}})
        print(f"c={n} slowdown added per step: {out[-1]}", flush=True)
    (args.runs / "terms.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
