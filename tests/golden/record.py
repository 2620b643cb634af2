"""Record (or check) the simulator's exact outputs for every policy on fixed workloads.

    python tests/golden/record.py          # rewrite tests/golden/runs.json from the current code

Each run's summary.json (minus wall-clock fields) is stored whole; requests.parquet and iterations.parquet are
stored as one SHA-256 per column of their exact bytes, so `tests/test_golden.py` can say which column of which
run moved. Refactors of the core must leave every entry bit-identical.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
RUNS_PATH = Path(__file__).with_name("runs.json")
WALL_CLOCK = {"sim_wall_s"}


def cases() -> list[dict[str, Any]]:
    """Every registered policy: roofline runs near each trace's interesting load (sharegpt at 2 QPS preempts
    under vLLM; some policies give up there as overloaded, which is pinned too), plus the shipped CPU fit on a
    scaled trace so the fitted cost model is covered too."""
    from simctl.policies.registry import POLICIES

    out = []
    for policy in POLICIES:
        for seed in (0, 1, 2):
            out.append({"policy": policy, "trace": "sharegpt", "qps": 2.0, "num_requests": 600, "seed": seed})
            out.append({"policy": policy, "trace": "arxiv", "qps": 0.5, "num_requests": 300, "seed": seed})
        out.append({"policy": policy, "trace": "sharegpt", "qps": 40.0, "num_requests": 300, "seed": 0,
                    "model": "tiny", "gpu": "cpu", "scale": 0.05})
    return out


def key(case: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(case.items()))


def column_hashes(frame: pd.DataFrame) -> dict[str, str]:
    # strings (a pool's name) by value, not by their objects' addresses
    def data(values: np.ndarray) -> bytes:
        return "\0".join(map(str, values)).encode() if values.dtype == object else values.tobytes()

    return {c: hashlib.sha256(data(frame[c].to_numpy())).hexdigest()[:20] for c in frame.columns}


def record(case: dict[str, Any]) -> dict[str, Any]:
    from dataclasses import fields

    from simctl.sim.run import RunConfig, run
    from simctl.traces.workload import Workload

    workload = {f.name for f in fields(Workload)}
    r = run(RunConfig(**{k: v for k, v in case.items() if k not in workload},
                      workload=Workload(**{k: v for k, v in case.items() if k in workload})))
    summary = {k: v for k, v in r.summary.items() if k not in WALL_CLOCK}
    # the cost model's label names the file it was read from: where the checkout lies is not a result
    summary["cost_model"] = summary["cost_model"].replace(str(ROOT), "<repo>")
    return {
        "summary": json.loads(json.dumps(summary)),
        "requests": column_hashes(r.result.requests),
        "iterations": column_hashes(r.iterations),  # as iterations.parquet holds them (pool and replica too)
    }


def main() -> None:
    sys.path.insert(0, str(ROOT))
    runs = {key(c): record(c) for c in cases()}
    RUNS_PATH.write_text(json.dumps(runs, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"{len(runs)} runs recorded in {RUNS_PATH}")


if __name__ == "__main__":
    main()
