"""Real vLLM steps by load: do a step's duration and the gap before the next step depend on the load, or only
on the step's rows? From the iteration records of `simctl validate --engine vllm` runs (each step's start and
duration as vLLM's step log gives them), pooled per load over the validations given: per bin of decode rows,
the median duration of decode-only steps and the median gap from a step's end to the next step's start
(consecutive steps only: gaps under 5 ms).

    .venv/bin/python research/vllm_step_gaps.py /tmp/wv2/val17/validation /tmp/wv2/val18/validation ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

BINS = ((1, 4), (5, 16), (17, 40), (41, 200))
CONSECUTIVE_S = 0.005


def steps(validations: list[Path], load: str) -> pd.DataFrame:
    """Every real run's steps at `load` but each run's last, with the gap from its end to the next start."""
    frames = []
    for v in validations:
        for f in sorted((v / "runs" / f"load_{load}").glob("real*/iterations.parquet")):
            it = pd.read_parquet(f).sort_values("start_s")
            gap_after = it["start_s"].shift(-1) - (it["start_s"] + it["duration_s"])
            frames.append(it.assign(gap_after_s=gap_after).iloc[:-1])
    return pd.concat(frames) if frames else pd.DataFrame()


def table(validations: list[Path], loads: list[str]) -> str:
    """The markdown table the script prints."""
    lines = [("| load | decode rows | decode-only steps | median duration ms | steps followed at once | "
              "median gap after ms |"), "|---|---|---:|---:|---:|---:|"]
    for load in loads:
        it = steps(validations, load)
        if it.empty:
            continue
        for lo, hi in BINS:
            rows = it[(it["batch_size"] >= lo) & (it["batch_size"] <= hi)]
            dec = rows[rows["prefill_tokens"] == 0]
            follow = rows[rows["gap_after_s"] < CONSECUTIVE_S]
            if len(rows):
                lines.append(f"| {load} | {lo}-{hi} | {len(dec)} | {dec['duration_s'].median() * 1e3:.2f} | "
                             f"{len(follow)} | {follow['gap_after_s'].median() * 1e3:.3f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("validations", nargs="+", type=Path, help="folders of validation_vllm.json")
    p.add_argument("--loads", default="0.5,0.7,0.9")
    args = p.parse_args()
    print(table(args.validations, args.loads.split(",")))


if __name__ == "__main__":
    main()
