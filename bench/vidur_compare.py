"""simctl against Vidur, whole processes side by side (issue 42's table): 1,000 and 10,000 requests.

    python bench/vidur_compare.py [--repeats 3] [--sizes 1000,10000] [--vidur-python PY] [--vidur-root DIR]

The workload is issue 42's on both: vllm's scheduler, sharegpt lengths (Vidur: the real trace, capped at 8,192
tokens; simctl: its fitted profile), Poisson arrivals at 1 QPS, CodeLlama-34B on A100s at TP 2, one replica.
Each figure is the median of --repeats fresh processes (wall, CPU = user + sys, peak RSS from os.wait4),
simctl and Vidur alternating, which goes first alternating between repeats. Start-up is split out: `import
simctl.cli` and the run's loop (summary `sim_wall_s`) for simctl, `import vidur.main` for Vidur.

Vidur is never a dependency of simctl: it runs in its own environment. --vidur-python (or
$SIMCTL_VIDUR_PYTHON) is that environment's interpreter and --vidur-root (or $SIMCTL_VIDUR_ROOT) the Vidur
repository it runs in (`python -m vidur.main`; data/profiling with the A100 CodeLlama-34B profiles,
data/processed_traces with the sharegpt trace). Vidur trains its sklearn models on first use and caches them
under the root: a probe run of a few requests trains them before anything is timed. Without either, or when
the probe fails, simctl runs alone and the report says why. Writes bench/results/vidur_compare.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

from startup_speed import RUN, SIMCTL, Sample, measure, med

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results" / "vidur_compare.md"
VIDUR = ["-m", "vidur.main", "--replica_config_device", "a100",
         "--replica_config_network_device", "a100_pairwise_nvlink",
         "--replica_config_model_name", "codellama/CodeLlama-34b-Instruct-hf",
         "--cluster_config_num_replicas", "1", "--replica_config_tensor_parallel_size", "2",
         "--replica_config_num_pipeline_stages", "1",
         "--request_generator_config_type", "synthetic", "--length_generator_config_type", "trace",
         "--trace_request_length_generator_config_max_tokens", "8192",
         "--trace_request_length_generator_config_trace_file",
         "./data/processed_traces/sharegpt_8k_filtered_stats_llama2_tokenizer.csv",
         "--interval_generator_config_type", "poisson",
         "--poisson_request_interval_generator_config_qps", "1",
         "--replica_scheduler_config_type", "vllm"]
# Vidur offline: no Weights & Biases upload, no Hugging Face look-up
VIDUR_ENV = {"WANDB_MODE": "disabled", "HF_HUB_OFFLINE": "1"}


def vidur_args(n: int, extra: list[str]) -> list[str]:
    """Vidur's arguments for `n` requests, `extra` (--vidur-args) before the count."""
    return [*VIDUR, *extra, "--synthetic_request_generator_config_num_requests", str(n)]


def vidur_probe(python: Path, root: Path, extra: list[str]) -> str | None:
    """None when Vidur runs a few requests (training and caching its models if it has not); else why not."""
    done = subprocess.run([str(python), *vidur_args(20, extra)], cwd=root, env={**os.environ, **VIDUR_ENV},
                          capture_output=True, text=True, timeout=3600, check=False)
    if done.returncode == 0:
        return None
    lines = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()]
    # the exception's line (Vidur logs on after it, at exit), else its last line
    errors = [line for line in lines if re.match(r"[\w.]+(Error|Exception)\b", line)]
    return f"exit {done.returncode}: {(errors or lines or ['(no output)'])[-1]}"


def pairs(sizes: list[int], extra: list[str]) -> list[tuple[str, list[str], list[str]]]:
    """Each case: its name, simctl's arguments and Vidur's (after the interpreter)."""
    return [("start-up (import)", ["-c", "import simctl.cli"], ["-c", "import vidur.main"]),
            *((f"run {n:,}", [*SIMCTL, *RUN, "--num-requests", str(n)], vidur_args(n, extra)) for n in sizes)]


def time_pairs(sizes: list[int], repeats: int, vidur: tuple[Path, Path] | None,
               extra: list[str]) -> dict[tuple[str, str], Sample]:
    """Samples by (simulator, case); Vidur's only with `vidur` (its interpreter and root)."""
    envs = {"simctl": {**os.environ, "PYTHONPATH": str(ROOT)}, "vidur": {**os.environ, **VIDUR_ENV}}
    samples: dict[tuple[str, str], Sample] = {}
    for rep in range(repeats):
        for case, ours, theirs in pairs(sizes, extra):
            runs = [("simctl", [sys.executable, *ours], ROOT)]
            if vidur is not None:
                runs.append(("vidur", [str(vidur[0]), *theirs], vidur[1]))
            for sim, argv, cwd in runs if rep % 2 == 0 else runs[::-1]:
                wall, cpu, rss, out = measure(argv, cwd, envs[sim])
                s = samples.setdefault((sim, case), Sample())
                s.add(wall, cpu, rss)
                if sim == "simctl" and case.startswith("run"):
                    s.loop.append(json.loads(out)["sim_wall_s"])
        print(f"repeat {rep + 1}/{repeats} done", file=sys.stderr)
    return samples


def report(samples: dict[tuple[str, str], Sample], sizes: list[int], repeats: int,
           why_alone: str | None) -> str:
    lines = [f"# simctl and Vidur, whole processes (`python {' '.join(sys.argv)}`)", "",
             (f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, {os.cpu_count()} CPUs; medians of "
              f"{repeats} fresh processes per case, simctl and Vidur alternating. vllm, sharegpt, 1 QPS, "
              "CodeLlama-34B, A100, TP 2 (simctl: bench/models/codellama-34b.json, roofline, `--json`). "
              "simctl's loop: its summary's sim_wall_s."), "",
             "| simulator | case | wall s | CPU s | peak RSS MB | loop s |", "|---|---|---:|---:|---:|---:|"]
    for case, _, _ in pairs(sizes, []):
        for sim in ("simctl", "vidur"):
            if (sim, case) in samples:
                s = samples[(sim, case)]
                lines.append(f"| {sim} | {case} | {med(s.wall)} | {med(s.cpu)} | {med(s.rss_mb, '{:.0f}')} | "
                             f"{med(s.loop)} |")
    if why_alone is not None:
        return "\n".join([*lines, "", f"Vidur did not run: {why_alone}"]) + "\n"
    lines += ["", ("| requests | simctl wall s | Vidur wall s | wall ratio | CPU ratio | "
                   "peak RSS MB simctl / Vidur |"), "|---:|---:|---:|---:|---:|---:|"]
    for n in sizes:
        ours, theirs = samples[("simctl", f"run {n:,}")], samples[("vidur", f"run {n:,}")]
        ratio = statistics.median(theirs.wall) / statistics.median(ours.wall)
        cpu_ratio = statistics.median(theirs.cpu) / statistics.median(ours.cpu)
        lines.append(f"| {n:,} | {med(ours.wall)} | {med(theirs.wall)} | {ratio:.1f}x | {cpu_ratio:.1f}x | "
                     f"{med(ours.rss_mb, '{:.0f}')} / {med(theirs.rss_mb, '{:.0f}')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--sizes", default="1000,10000", help="requests per run, comma-separated")
    parser.add_argument("--vidur-python", type=Path, default=os.environ.get("SIMCTL_VIDUR_PYTHON"),
                        help="the interpreter of Vidur's own environment")
    parser.add_argument("--vidur-root", type=Path, default=os.environ.get("SIMCTL_VIDUR_ROOT"),
                        help="Vidur's repository, with its data/")
    parser.add_argument("--vidur-args", default="", help="more arguments for every Vidur run (one string), "
                        "e.g. a smaller training grid; its trained models are cached per arguments")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    sizes = [int(n) for n in args.sizes.split(",")]
    extra = shlex.split(args.vidur_args)
    why_alone = "no --vidur-python and --vidur-root (nor $SIMCTL_VIDUR_PYTHON, $SIMCTL_VIDUR_ROOT)"
    if args.vidur_python is not None and args.vidur_root is not None:
        why_alone = vidur_probe(args.vidur_python, args.vidur_root, extra)
    vidur = None if why_alone is not None else (args.vidur_python, args.vidur_root.resolve())
    text = report(time_pairs(sizes, args.repeats, vidur, extra), sizes, args.repeats, why_alone)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
