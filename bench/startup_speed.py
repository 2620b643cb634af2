"""Whole-process speed of `simctl` (issue 42): help, a 20-, 1,000- and 10,000-request run, start-up split out.

    python bench/startup_speed.py [--repeats 5] [--baseline DIR] [--sizes 20,1000,10000] [--vidur-root DIR]

Every case is a fresh process, timed by wall clock from its start to its exit, with its own peak RSS (the
child's rusage from os.wait4, what resource.getrusage(RUSAGE_CHILDREN) reports for one child); each figure is
the median of --repeats. The runs are issue 42's: vllm on sharegpt at 1 QPS, CodeLlama-34B (its shape:
bench/models/codellama-34b.json) on A100-80GB, TP 2, roofline. Start-up is split out: the interpreter alone
(`python -c pass`), `import simctl.cli` (what help and option parsing pay), and for a run its replica loop
(summary `sim_wall_s`) against the whole process: whole - loop is what the run spends outside the loop
(imports, trace, configuration, summary).

--baseline DIR times another checkout (e.g. the unchanged main) in the same invocation, the two trees
alternating case by case, which tree goes first alternating between repeats: on a shared, noisy machine only
figures measured side by side compare. With a `vidur` package importable (and --vidur-root, its repository
with data/ and its trained profiles), Vidur's whole process runs the same workload beside simctl; without one,
simctl alone. Writes bench/results/startup_speed.md.
"""

from __future__ import annotations

import argparse
import importlib.util
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
VIDUR = ["-m", "vidur.main", "--replica_config_device", "a100",
         "--replica_config_model_name", "codellama/CodeLlama-34b-Instruct-hf",
         "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "2",
         "--replica_config_num_pipeline_stages", "1",
         "--request_generator_config_type", "synthetic", "--length_generator_config_type", "trace",
         "--trace_request_length_generator_config_max_tokens", "8192",
         "--trace_request_length_generator_config_trace_file",
         "./data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
         "--interval_generator_config_type", "poisson",
         "--poisson_request_interval_generator_config_qps", "1",
         "--replica_scheduler_config_type", "vllm", "--synthetic_request_generator_config_num_requests"]


@dataclass
class Sample:
    wall: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    loop: list[float] = field(default_factory=list)  # a run's sim_wall_s


def measure(argv: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, float, str]:
    """Wall seconds, peak RSS (MB) and stdout of one child process."""
    start = time.perf_counter()
    child = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    out = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {child.returncode}")
    return wall, usage.ru_maxrss / 1024, out


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
                # in the tree's folder: `python -c` puts the working folder first on sys.path
                env = {**os.environ, "PYTHONPATH": str(trees[tree])}
                wall, rss, out = measure([sys.executable, *args], trees[tree], env)
                s = samples.setdefault((tree, case), Sample())
                s.wall.append(wall)
                s.rss_mb.append(rss)
                if case.startswith("run "):
                    s.loop.append(json.loads(out)["sim_wall_s"])
        print(f"repeat {rep + 1}/{repeats} done", file=sys.stderr)
    return samples


def time_vidur(root: Path, sizes: list[int], repeats: int) -> dict[str, Sample]:
    samples: dict[str, Sample] = {}
    for _ in range(repeats):
        for n in sizes:
            wall, rss, _ = measure([sys.executable, *VIDUR, str(n)], root, dict(os.environ))
            s = samples.setdefault(f"run {n:,}", Sample())
            s.wall.append(wall)
            s.rss_mb.append(rss)
    return samples


def med(values: list[float], fmt: str = "{:.3f}") -> str:
    return fmt.format(statistics.median(values)) if values else "-"


def report(samples: dict[tuple[str, str], Sample], trees: dict[str, Path], sizes: list[int], repeats: int,
           vidur: dict[str, Sample] | None) -> str:
    lines = [f"# simctl start-up and whole-process speed (`python {' '.join(sys.argv)}`)", "",
             (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs, Python "
              f"{platform.python_version()}; medians of {repeats} fresh processes per case, trees "
              "alternating. Runs: vllm, sharegpt, 1 QPS, CodeLlama-34B (bench/models/codellama-34b.json), "
              "A100-80GB, TP 2, roofline, `--json`. loop: the run's sim_wall_s (replica loop); "
              "whole - loop: everything else (imports, trace, configuration, summary)."), "",
             "| tree | case | wall s | peak RSS MB | loop s | whole - loop s |",
             "|---|---|---:|---:|---:|---:|"]
    for case in cases(sizes):
        for tree in trees:
            s = samples[(tree, case)]
            rest = f"{statistics.median(s.wall) - statistics.median(s.loop):.3f}" if s.loop else "-"
            lines.append(f"| {tree} | {case} | {med(s.wall)} | {med(s.rss_mb, '{:.0f}')} | {med(s.loop)} | "
                         f"{rest} |")
    if vidur is None:
        lines += ["", "Vidur: no `vidur` package importable here (or no --vidur-root): simctl alone."]
    else:
        lines += ["", "| requests | simctl wall s | Vidur wall s | ratio | peak RSS MB simctl / Vidur |",
                  "|---:|---:|---:|---:|---:|"]
        first = next(iter(trees))
        for n in sizes:
            case = f"run {n:,}"
            if case not in vidur:
                continue
            ours, theirs = samples[(first, case)], vidur[case]
            ratio = statistics.median(theirs.wall) / statistics.median(ours.wall)
            lines.append(f"| {n:,} | {med(ours.wall)} | {med(theirs.wall)} | {ratio:.1f}x | "
                         f"{med(ours.rss_mb, '{:.0f}')} / {med(theirs.rss_mb, '{:.0f}')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--sizes", default="20,1000,10000", help="requests per run, comma-separated")
    parser.add_argument("--baseline", type=Path, help="another checkout to time side by side (its root)")
    parser.add_argument("--vidur-root", type=Path, help="Vidur's repository (data/, trained profiles)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees["baseline " + str(args.baseline)] = args.baseline.resolve()
    samples = time_trees(trees, sizes, args.repeats)
    vidur = None
    if importlib.util.find_spec("vidur") is not None and args.vidur_root is not None:
        vidur = time_vidur(args.vidur_root, [n for n in sizes if n >= 1000], args.repeats)
    text = report(samples, trees, sizes, args.repeats, vidur)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
