"""Which H100 decode terms would make the vllm-v1 twin match measured vLLM serving on two model sizes, and
what do they do to every other case? (simctl issue 39, item 3's question, asked of bench/gpu_serving.py's
data.)

    python research/gpu_decode_terms.py [--root ../shared/reference/gpu_serving]

The twin decodes CodeLlama-34B ~9% fast and Llama-2-7B ~9% slow on an H100 (bench/results/gpu_serving.md): one
model's error is not the other's, so no single scale fixes both. Two H100 terms move them differently: the HBM
efficiency `mbu` (the weights' read: 4x more bytes for the 34B) and the per-step host time `overhead_s` (the
same for both). They are fitted here (least squares of predicted / measured - 1) on the synchronous phases'
P50 TPOT of the two `train` files only (one request at a time: no batching or queueing in them), then every
phase and the CI latency cases are predicted with them, on the H100 only (other GPUs keep the catalogue's).
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simctl.costs.roofline import Roofline

ROOT = Path(__file__).resolve().parents[1]
TRAIN = ("jan20-codellama-train-1.csv", "jan21-llama7b-train-1.csv")  # their synchronous phases


def bench_module():
    spec = importlib.util.spec_from_file_location("gpu_serving", ROOT / "bench" / "gpu_serving.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_serving"] = module
    spec.loader.exec_module(module)
    return module


def priced_with(bench, mbu: float, overhead_s: float) -> None:
    """The bench's cost model with these H100 terms (every other GPU as the catalogue has it)."""
    def cost_model(model, gpu, tp, allreduce="vllm"):
        # as simctl priced the other GPUs when this was run (before 2026-11-28's adoption of
        # gpu_step_forms.md's terms): 2 ms a step, nothing per request, the H200 at the default mbu 0.75
        terms = ({"mbu": mbu, "overhead_s": overhead_s} if gpu == "h100"
                 else {"overhead_s": 2e-3, **({"mbu": 0.75} if gpu == "h200" else {})})
        return Roofline(model, gpu, tp, allreduce=allreduce, request_s=0.0, **terms)

    bench.cost_model = cost_model


def fit(bench, root: Path) -> tuple[float, float]:
    phases = []
    for case in bench.CASES:
        if case.file in TRAIN:
            frame = pd.read_csv(root / case.file)
            rows = frame[frame["phase"] == bench.SYNCHRONOUS]
            phases.append((case, rows, bench.measured(rows)["tpot"]))

    def residuals(x: np.ndarray) -> list[float]:
        priced_with(bench, float(x[0]), float(x[1]) * 1e-3)
        return [bench.predicted(c, bench.SYNCHRONOUS, rows)["tpot"] / tpot - 1 for c, rows, tpot in phases]

    sol = least_squares(residuals, x0=[0.9, 1.0], bounds=([0.5, 0.0], [1.0, 5.0]), diff_step=1e-3)
    return float(sol.x[0]), float(sol.x[1]) * 1e-3


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=ROOT.parent / "shared" / "reference" / "gpu_serving")
    a = p.parse_args(argv)
    if not a.root.is_dir():
        print(f"skipped: no reference measurements at {a.root}")
        return 0
    bench = bench_module()
    mbu, overhead_s = fit(bench, a.root)
    print(f"fitted H100: mbu {mbu:.3f}, overhead_s {overhead_s * 1e3:.2f} ms")
    priced_with(bench, mbu, overhead_s)
    rows, ci, kv = bench.run(a.root)
    print(bench.markdown(rows, ci, kv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
