"""Whole-process speed of `simctl` (issue 42): help, a 20-, 1,000- and 10,000-request run, start-up split out.

    python bench/startup_speed.py [--repeats 5] [--baseline DIR] [--sizes 20,1000,10000]

Every case is a fresh process, timed by wall clock from its start to its exit, with its CPU time (user + sys)
and peak RSS (the child's rusage from os.wait4, what resource.getrusage(RUSAGE_CHILDREN) reports for one
child); each figure is the median of --repeats. On a shared machine the CPU time is the steadier figure: a
loaded machine stretches wall time, not the work a process does. The runs are issue 42's: vllm on sharegpt
at 1 QPS, CodeLlama-34B (its shape: bench/models/codellama-34b.json) on A100-80GB, TP 2, roofline.
Start-up is split out: the interpreter alone (`python -c pass`), `import simctl.cli` (what help and option
parsing pay), and for a run its replica loop (summary `sim_wall_s`) against the whole process: whole - loop
is what the run spends outside the loop (imports, trace, configuration, summary).

--baseline DIR times another checkout (e.g. the unchanged main) in the same invocation, the two trees
alternating case by case, which tree goes first alternating between repeats: on a shared, noisy machine only
figures measured side by side compare. Writes bench/results/startup_speed.md. Vidur beside simctl:
bench/vidur_compare.py.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "startup_speed.md"
MODEL = ROOT / "bench" / "models" / "codellama-34b.json"
# the console script's own entry, so that any checkout on PYTHONPATH is the one that runs
SIMCTL = ["-c", "import sys; from simctl.cli import main; main()"]
RUN = ["run", "--policy", "vllm", "--trace", "sharegpt", "--qps", "1", "--gpu", "a100-80gb", "--tp", "2",
       "--model", str(MODEL), "--json"]
@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # user + sys
    rss_mb: list[float] = field(default_factory=list)
    loop: list[float] = field(default_factory=list)  # a run's sim_wall_s

    def add(self, wall: float, cpu: float, rss_mb: float) -> None:
        self.wall.append(wall)
        self.cpu.append(cpu)
        self.rss_mb.append(rss_mb)


def measure(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, float, str]:
    """Wall seconds, CPU seconds, peak RSS (MB) and stdout of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out


def cases(sizes: list[int]) -> dict[str, list[str]]:
    """simctl's cases by name: its arguments after the interpreter."""
    return {"python -c pass": ["-c", "pass"], "import simctl.cli": ["-c", "import simctl.cli"],
            "simctl --help": [*SIMCTL, "--help"], "simctl run --help": [*SIMCTL, "run", "--help"],
            **{f"run {n:,}": [*SIMCTL, *RUN, "--num-requests", str(n)] for n in sizes}}


def time_trees(trees: dict[str, Path], sizes: list[int], repeats: int) -> dict[tuple[str, str], Sample]:
    samples: dict[tuple[str, str], Sample] = {}
    names = list(trees)
    for rep in range(repeats):
        order = names if rep % 2 == 0 else names[::-1]
        for case, args in cases(sizes).items():
            for tree in order:
                # in the tree's folder: `python -c` puts the working folder first on sys.path; bytecode
                # cached, as an installation has it (with PYTHONDONTWRITEBYTECODE every start compiles)
                env = {**os.environ, "PYTHONPATH": str(trees[tree])}
                env.pop("PYTHONDONTWRITEBYTECODE", None)
                wall, cpu, rss, out = measure([sys.executable, *args], trees[tree], env)
                s = samples.setdefault((tree, case), Sample())
                s.add(wall, cpu, rss)
                if case.startswith("run "):
                    s.loop.append(json.loads(out)["sim_wall_s"])
        print(f"repeat {rep + 1}/{repeats} done", file=sys.stderr)
    return samples


def med(values: list[float], fmt: str = "{:.3f}") -> str:
    return fmt.format(statistics.median(values)) if values else "-"


def report(samples: dict[tuple[str, str], Sample], trees: dict[str, Path], sizes: list[int],
           repeats: int) -> str:
    lines = [f"# simctl start-up and whole-process speed (`python {' '.join(sys.argv)}`)", "",
             (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}; medians of {repeats} fresh processes per case, trees "
              "alternating. Runs: vllm, sharegpt, 1 QPS, CodeLlama-34B (bench/models/codellama-34b.json), "
              "A100-80GB, TP 2, roofline, `--json`. loop: the run's sim_wall_s (replica loop); "
              "whole - loop: everything else (imports, trace, configuration, summary)."), "",
             "| tree | case | wall s | CPU s | peak RSS MB | loop s | whole - loop s |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for case in cases(sizes):
        for tree in trees:
            s = samples[(tree, case)]
            rest = f"{statistics.median(s.wall) - statistics.median(s.loop):.3f}" if s.loop else "-"
            lines.append(f"| {tree} | {case} | {med(s.wall)} | {med(s.cpu)} | {med(s.rss_mb, '{:.0f}')} | "
                         f"{med(s.loop)} | {rest} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="20,1000,10000", help="requests per run, comma-separated")
    parser.add_argument("--baseline", type=Path, help="another checkout to time side by side (its root)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees["baseline " + str(args.baseline)] = args.baseline.resolve()
    samples = time_trees(trees, sizes, args.repeats)
    text = report(samples, trees, sizes, args.repeats)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
