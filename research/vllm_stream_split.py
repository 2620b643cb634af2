"""Where a vLLM profile's served steps differ from the fit's price, by kind of step: the request streams'
excess (served period - the fit's price) regressed as `profiler.vllm_stream.fit_stream` does (robust least
squares, soft L1 at 0.5 ms), but with the per-step and per-row terms split between decode-only steps and
steps that also prefill; then served over priced time by kind and size.

    .venv/bin/python research/vllm_stream_split.py PROFILE_DIR [PROFILE_DIR ...]  (each fitted)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

TERMS = ("step (decode-only)", "step (mixed)", "row (decode-only)", "row (mixed)", "prompt token", "new",
         "arrival")
SIZES = ((1, 8), (9, 32), (33, 1 << 30))


def split(profile: Path) -> None:
    from simctl.costs.fitted import Fitted
    from simctl.profiler.vllm_stream import StreamStep, robust_lstsq

    cost = Fitted.load(profile / "cost_model.json")
    meta = json.loads((profile / "meta.json").read_text(encoding="utf-8"))
    steps = [StreamStep.from_json(d) for d in meta["served_stream"]]
    period = np.array([s.period_s for s in steps])
    price = np.array([cost.iteration_time(s.plan()) for s in steps])
    mixed = np.array([1.0 if s.prefills else 0.0 for s in steps])
    rows = np.array([len(s.decode_contexts) for s in steps], dtype=float)
    x = np.column_stack([1 - mixed, mixed, rows * (1 - mixed), rows * mixed, [sum(s.prefills) for s in steps],
                         [s.new for s in steps], [s.arrivals for s in steps]])
    coef = robust_lstsq(x, period - price)
    print(f"{profile}: {len(steps)} steps ({int(mixed.sum())} mixed)")
    print("  " + ", ".join(f"{n} {v * 1e6:+.1f} us" for n, v in zip(TERMS, coef)))
    for kind, k in (("decode-only", mixed == 0), ("mixed", mixed == 1)):
        for lo, hi in SIZES:
            m = k & (rows >= lo) & (rows <= hi)
            if m.any():
                size = f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+"
                print(f"  {kind} steps of {size} decode rows: {int(m.sum())}, served / priced "
                      f"{period[m].sum() / price[m].sum():.3f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("profiles", nargs="+", type=Path, help="fitted vLLM profile folders")
    for d in ap.parse_args().profiles:
        split(d)


if __name__ == "__main__":
    main()
