"""Where the twin's session latencies part from vLLM's (issue 37, target (a), item 3): reads the real runs
`bench/sessions_vllm_latency.py` wrote (`--runs`) and splits each run's latencies into the terms the records
hold, beside the twin's at that run's machine speed (the speed factor the run recorded):

- sched delay: send to the first step that scheduled the request (queueing, the scheduler, the front end);
- prefill: first scheduled step to the first token (the prefill step's cost, or its chunks);
- decode: first token to completion over the tokens after the first (the decode steps' cost, batch mixes);
- steps: how many engine steps the run took and their mean duration (the step-cost term on its own);
- think: a session's later turn sent after its predecessor completed (real: the send gap minus its think_s,
  which the clients add; the front end's delay between them).

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

from simctl.costs.base import ScaledCost
from simctl.validation.twin import load_cost
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
            "steps": float(len(it)), "step_mean_ms": float(it["duration_s"].mean() * 1e3),
            "mean_batch": float(it["batch_size"].mean()),
            "busy_s": float(it["duration_s"].sum()), "makespan_s": float(req["completion_s"].max()),
            "preemptions": float(req["preemptions"].sum()),
            "think_gap_p50_ms": float(np.median(gaps) * 1e3) if gaps else float("nan"),
            "think_gap_max_ms": float(np.max(gaps) * 1e3) if gaps else float("nan")}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=Path, required=True)
    p.add_argument("--cost", required=True)
    for name, kind, default in (("--num-requests", int, 300), ("--qps", float, 100.0), ("--scale", float, 0.25),
                                ("--system-prompt-tokens", int, 1024), ("--system-prompts", int, 4),
                                ("--session-think-time", float, 1.0), ("--seed", int, 0)):
        p.add_argument(name, type=kind, default=default)
    args = p.parse_args()
    saved = json.loads((args.runs / "rows.json").read_text())
    cost, settings = load_cost(args.cost, "tiny"), saved["settings"]
    out: list[dict[str, Any]] = []
    for row in saved["rows"]:
        n = row["concurrency"]
        v = VLLMValidation(cost=cost, workload=workload(args, n))
        requests = v.requests_at(args.qps)
        think = {r.id: (r.previous, r.think_s) for r in requests if r.previous >= 0}
        for k, speed in enumerate(row["speeds"]):
            where = args.runs / f"c{n}" / "runs" / "load_1" / ("real" if k == 0 else f"real_{k + 1}")
            real = terms(pd.read_parquet(where / "requests.parquet"), pd.read_parquet(where / "iterations.parquet"),
                         think)
            _, result = simulate_requests(requests, settings, ScaledCost(cost, speed), **v.clients)
            twin = terms(result.requests, result.iterations.frame(), think)
            out.append({"concurrency": n, "run": k + 1, "speed": speed, "real": real, "twin": twin})
            print(f"c={n} run {k + 1} speed {speed:.2f}: " + ", ".join(
                f"{t} {real[t]:.4g}/{twin[t]:.4g}" for t in real), flush=True)
    (args.runs / "terms.json").write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
