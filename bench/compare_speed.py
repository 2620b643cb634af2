"""Simulator speed of this tree against another git revision, as ratios measured in one run.

    python bench/compare_speed.py REV [--requests 10000] [--repeats 5] [--policy NAME=QPS ...]

Checks REV out into a temporary worktree and times the same simulation (sharegpt, Mistral-7B / A100-80GB
roofline, each policy at the rate bench/sim_speed.py uses: 70% of its capacity there) alternately with REV's
code and this tree's, each in a fresh process; reports the median simulation-loop seconds of each and their
ratio (which tree runs first alternates between repeats). Alternating in one run is what makes the ratio
meaningful on a shared, noisy machine: absolute speed drifts by x4 between sessions here. `--policy NAME=QPS`
(repeatable) times those instead, e.g. the policies whose capacity sim_speed.json does not hold. Writes
bench/results/speed_vs_<REV>.md (with --policy: speed_vs_<REV>_more.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
QPS = {  # 70% of each policy's sharegpt capacity (bench/results/sim_speed.json)
    "faster-transformer": 0.1326, "orca": 1.1375, "vllm": 2.1875, "sarathi": 2.1875,
    "sarathi-hybrid-only": 2.2312, "sarathi-chunked-only": 2.1219,
}
CHILD = ("import json, sys, time; from simctl.sim.run import RunConfig, run; "
         "from simctl.traces.workload import Workload; t = time.process_time(); "
         "r = run(RunConfig(policy=sys.argv[1], workload=Workload(trace='sharegpt', qps=float(sys.argv[2]), "
         "num_requests=int(sys.argv[3]), seed=0))); "
         "print(json.dumps([r.summary['sim_wall_s'], time.process_time() - t]))")


def time_once(tree: Path, policy: str, n: int, qps: float) -> tuple[float, float]:
    """The loop's wall seconds and the whole run's CPU seconds (trace, loop, summary) of one process."""
    out = subprocess.run([sys.executable, "-c", CHILD, policy, str(qps), str(n)], cwd=tree, check=True,
                         capture_output=True, text=True,
                         env={"PYTHONPATH": str(tree), "PATH": "/usr/bin:/bin"})
    wall, cpu = json.loads(out.stdout.strip().splitlines()[-1])
    return float(wall), float(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rev")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--policy", action="append", default=[], metavar="NAME=QPS")
    args = ap.parse_args()
    rates = {n: float(q) for n, q in (p.split("=") for p in args.policy)} or QPS
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(["git", "worktree", "add", "--detach", str(base), args.rev], cwd=ROOT, check=True,
                       capture_output=True)
        try:
            for policy, qps in rates.items():
                times: dict[str, list[tuple[float, float]]] = {"base": [], "this": []}
                for i in range(args.repeats):  # which tree goes first alternates: no order bias
                    for name in (("base", "this") if i % 2 == 0 else ("this", "base")):
                        times[name].append(time_once(base if name == "base" else ROOT, policy, args.requests,
                                                     qps))
                b, t = (statistics.median(w for w, _ in times["base"]),
                        statistics.median(w for w, _ in times["this"]))
                bc, tc = (statistics.median(c for _, c in times["base"]),
                          statistics.median(c for _, c in times["this"]))
                rows.append((policy, b, t, bc, tc))
                print(f"{policy:22s} {args.rev}: {b:.3f} s  this: {t:.3f} s  ratio {t / b:.3f}  "
                      f"CPU {bc:.3f} / {tc:.3f} s  ratio {tc / bc:.3f}", flush=True)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(base)], cwd=ROOT, check=False)
    lines = [f"# Simulator speed: this tree vs {args.rev}", "",
             (f"`python bench/compare_speed.py {args.rev} --requests {args.requests} --repeats {args.repeats}"
              f"{''.join(f' --policy {p}' for p in args.policy)}`: sharegpt, "
              "Mistral-7B / A100-80GB roofline, "
              + ("the rates given" if args.policy else "70% of each policy's capacity")
              + ("; median simulation-loop wall seconds and whole-run CPU seconds (trace, loop, summary: "
                 "the steadier figure on a shared machine) over the repeats, the two trees alternating in "
                 "fresh processes.")),
             "",
             (f"| policy | {args.rev} s | this s | this / {args.rev} | {args.rev} CPU s | this CPU s | "
              f"CPU this / {args.rev} | req/s (this) |"),
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p} | {b:.3f} | {t:.3f} | {t / b:.3f} | {bc:.3f} | {tc:.3f} | {tc / bc:.3f} | "
              f"{args.requests / t:,.0f} |" for p, b, t, bc, tc in rows]
    out = ROOT / "bench" / "results" / f"speed_vs_{args.rev[:12]}{'_more' if args.policy else ''}.md"
    out.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
