"""simctl's vllm-v1 twin against the real vLLM engine on this CPU: profile vLLM's steps, fit them, then
`validation.vllm_validate` at loads 0.5, 0.7 and 0.9 of the twin's capacity (3 rounds, medians), the real
capacity bisected too.

Targets (issue 20): |error| <= 10% for P50 TTFT, TPOT, ITL and E2E and <= 20% for their P99s, and |capacity
error| <= 10%, at the machine's speed during the runs. Writes bench/results/validate_vllm_latest.md (the
run's table with the targets' misses listed) and validate_vllm_latest.json, beside the study that
validate_vllm.md keeps by hand; the runs' folders, the profile and its fit go to --out [default: a temporary
folder], which is printed.

    .venv/bin/python bench/validate_vllm.py [--cost FIT] [--repeats 3] [--num-requests 150] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TARGETS = {"ttft_p50": 10.0, "tpot_p50": 10.0, "tbt_p50": 10.0, "e2e_p50": 10.0, "ttft_p99": 20.0,
           "tpot_p99": 20.0, "tbt_p99": 20.0, "e2e_p99": 20.0}
CAPACITY_TARGET = 10.0


def fit_of_vllm(out: Path) -> Path:
    """Profile vLLM's steps on this machine and fit them (a few minutes), as a user would."""
    simctl = str(Path(sys.executable).parent / "simctl")
    profile_dir = out / "vllm-profile"
    subprocess.run([simctl, "profile", "--engine", "vllm", "--model", "tiny", "--out", str(profile_dir)],
                   check=True)
    subprocess.run([simctl, "fit", str(profile_dir)], check=True)
    return profile_dir / "cost_model.json"


def misses(report: dict, suffix: str = "_at_speed") -> list[str]:
    """The targets missed: at the machine's speed (`suffix` "_at_speed"), or by the runs made at the fit's
    speed against the raw twin ("_at_fit_speed")."""
    from simctl.results.validation_report import metric_label
    from simctl.validation.vllm_validate import LABELS

    out = []
    for row in report["rows"]:
        for m, limit in TARGETS.items():
            err = row.get(f"{m}_err_pct{suffix}")
            if err is None or abs(err) > limit:
                shown = "undefined" if err is None else f"{err:+.1f}%"
                out.append(f"load {row['load']:g} {metric_label(m, LABELS)}: {shown} (target {limit:g}%)")
    err = report["capacity"].get("err_pct")
    if "real_qps" in report["capacity"] and (err is None or abs(err) > CAPACITY_TARGET):
        shown = "undefined" if err is None else f"{err:+.1f}%"
        out.append(f"capacity: {shown} (target {CAPACITY_TARGET:g}%)")
    return out


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text(encoding="utf-8").split()[:3])


def main() -> None:
    from simctl.validation.vllm_validate import VLLMValidation, markdown, validate_vllm

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", help="a fit of vLLM's steps on this machine [default: profile and fit now]")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--num-requests", type=int, default=150)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="simctl-validate-vllm-"))
    print(f"runs, profile and fit in {out}", file=sys.stderr)
    cost = args.cost or str(fit_of_vllm(out))
    v = VLLMValidation(cost=cost, out=out / "validation", loads=(0.5, 0.7, 0.9), repeats=args.repeats,
                       capacity=True)
    v = replace(v, workload=replace(v.workload, num_requests=args.num_requests))
    start, load0 = time.strftime("%H:%M:%S", time.gmtime()), _load()
    report = validate_vllm(v, log=lambda line: print(line, file=sys.stderr))
    when = (f"Validated {start}-{time.strftime('%H:%M:%S', time.gmtime())} UTC; machine load averages (1, 5, "
            f"15 min) {load0} at the start, {_load()} at the end.\n\n")
    text = markdown(report).replace("\n\n", "\n\n" + when, 1)
    for title, suffix in (("at the machine's speed", "_at_speed"),
                          ("runs at the fit's speed against the raw twin", "_at_fit_speed")):
        missed = misses(report, suffix)
        listed = "\n".join(f"- {m}" for m in missed) if missed else "none"
        text += f"\n## Targets missed ({title})\n\n{listed}\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "validate_vllm_latest.md").write_text(text, encoding="utf-8")
    (RESULTS / "validate_vllm_latest.json").write_text(json.dumps(report, indent=1, default=str) + "\n",
                                                encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
