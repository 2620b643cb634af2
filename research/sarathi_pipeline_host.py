"""Why did SARATHI's pipeline study (bench/papers/pipeline.py --part sarathi) move when the roofline's host
terms changed (2 ms a step -> 18.1 us x layers + 0.118 ms per scheduled request, costs/overheads.py)?

    python research/sarathi_pipeline_host.py [--requests 1024 ...]

Runs the study's rows (its trace, model, deployment and systems, imported from the study) under three host
forms, set through costs.overheads' defaults for this process only: the fitted form, the fitted form without
its per-request term, and the old 2 ms a step. Prints each system's tokens/s, bubbles and ratios to Orca.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from simctl.costs import overheads
from simctl.sim.run import RunConfig, run
from simctl.traces.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench" / "papers"))
from pipeline import A100, GPT3, SYSTEMS, offline_trace, write_config

GPT3_LAYERS = GPT3["num_hidden_layers"]
FITTED = (overheads.HOST_S_PER_LAYER, overheads.HOST_S_PER_REQUEST)
FORMS = {"fitted: 18.1 us x layers + 0.118 ms/request": FITTED,
         "fitted, no per-request term": (FITTED[0], 0.0),
         "before: 2 ms a step": (2e-3 / GPT3_LAYERS, 0.0)}


def rows(folder: Path, n: int) -> list[str]:
    model, trace = write_config(folder, "gpt-3-175b", GPT3), offline_trace(folder, n)
    out = []
    for form, (per_layer, per_request) in FORMS.items():
        overheads.HOST_S_PER_LAYER, overheads.HOST_S_PER_REQUEST = per_layer, per_request
        base = None
        for system, policy, options in SYSTEMS:
            s = run(RunConfig(policy=policy, workload=Workload(trace=trace, qps=None, num_requests=n),
                              model=model, **A100, tp=8, pp=8, pp_link_gbps=1600.0, options=options)).summary
            tokens, bubbles = s["total_tokens_per_s"], sum(s["pipeline"]["bubble_s"])
            makespan = s["makespan_s"]
            base = base or (tokens, bubbles)
            out.append(f"| {n} | {form} | {system} | {tokens:,.0f} | {makespan:.1f} | {bubbles:.1f} | "
                       f"{base[1] / bubbles:.2f}x | {tokens / base[0]:.2f}x |")
    overheads.HOST_S_PER_LAYER, overheads.HOST_S_PER_REQUEST = FITTED
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs="+", default=[1024])
    args = ap.parse_args()
    lines = [("| requests | host form | system | tokens/s | makespan s | bubbles s | bubbles fewer than "
              "Orca | throughput over Orca |"), "|---|---|---|---:|---:|---:|---:|---:|"]
    for n in args.requests:
        with tempfile.TemporaryDirectory() as tmp:
            lines += rows(Path(tmp), n)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
