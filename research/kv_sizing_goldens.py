"""Is the KV capacity the only thing vLLM's memory profile changes in the recorded goldens?

    python research/kv_sizing_goldens.py [--runs tests/golden/runs.json]

For every golden case whose recorded summary differs from the current code's, reruns it with the recorded
KV capacity pinned (`--kv-cache-tokens`, `costs.kv_capacity.KVSizing`) and checks that the summary (less the
pinned setting it records) and every column of the requests and iterations tables are bit-identical to the
recording. Prints one line per case; exits 1 if any pinned run differs.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import fields
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "golden"))


def pinned(case: dict, kv: int) -> dict:
    """`record.record(case)` with the KV cache's capacity given."""
    import record

    from simctl.costs.kv_capacity import KVSizing
    from simctl.sim.run import RunConfig, run
    from simctl.traces.workload import Workload

    workload = {f.name for f in fields(Workload)}
    r = run(RunConfig(**{k: v for k, v in case.items() if k not in workload},
                      kv_sizing=KVSizing(kv_cache_tokens=kv),
                      workload=Workload(**{k: v for k, v in case.items() if k in workload})))
    summary = {k: v for k, v in r.summary.items() if k not in record.WALL_CLOCK and k != "kv_cache_tokens"}
    summary["cost_model"] = summary["cost_model"].replace(str(record.ROOT), "<repo>")
    return {"summary": json.loads(json.dumps(summary)), "requests": record.column_hashes(r.result.requests),
            "iterations": record.column_hashes(r.iterations)}


def main() -> None:
    import record

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=Path, default=record.RUNS_PATH)
    runs = json.loads(ap.parse_args().runs.read_text(encoding="utf-8"))
    bad = 0
    for case in record.cases():
        want = runs[record.key(case)]
        now = record.record(case)
        if now == want:
            continue
        old, new = want["summary"]["kv_capacity_tokens"], now["summary"]["kv_capacity_tokens"]
        same = pinned(case, old) == want
        bad += not same
        print(f"{record.key(case)}: KV {old} -> {new}; pinned to {old}: "
              f"{'bit-identical' if same else 'DIFFERS'}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
