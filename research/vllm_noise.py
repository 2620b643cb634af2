"""The noise floor of a vLLM validation on this machine: real vLLM against itself, on the identical requests
and loads `simctl validate --engine vllm` serves (loads 0.5, 0.7, 0.9 of the twin's capacity under a fit).

One engine; after one discarded run per load (warm-up), `--rounds` rounds each serve every load once, with the
closed-batch speed probe the validation once used (the trace's first PROBE_REQUESTS requests at t=0) served
before and after each load. Then the real capacity is bisected `--capacities` times, as the validation bisects
it.
Reports, per load and metric, each round's value, the spread (max - min) / median and the largest pairwise
difference between rounds; the probes' makespans; and whether the probe follows the runs (the Spearman
correlation, over the rounds of a load, of the probe's makespan with the run's P50 ITL and E2E).

    .venv/bin/python research/vllm_noise.py --cost FIT [--rounds 4] [--capacities 2] [--out DIR]

Writes research/results/vllm_noise.md and vllm_noise.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "research" / "results"
SHOWN = ("ttft_p50", "tpot_p50", "tbt_p50", "e2e_p50", "ttft_p99", "tpot_p99", "tbt_p99", "e2e_p99",
         "throughput_rps")
PROBE_REQUESTS = 16


def spread(values: list[float]) -> tuple[float, float]:
    """(max - min) / median and the largest |a - b| / min(a, b) over pairs, in percent."""
    med = statistics.median(values)
    pair = max(abs(a - b) / min(a, b) for a, b in itertools.combinations(values, 2))
    return 100 * (max(values) - min(values)) / med, 100 * pair


def rank_corr(a: list[float], b: list[float]) -> float | None:
    from scipy.stats import spearmanr

    if len(a) < 3 or len(set(a)) < 2 or len(set(b)) < 2:
        return None
    return float(spearmanr(a, b).statistic)


def measure(cost: str, rounds: int, capacities: int, out: Path) -> dict:
    from simctl.engine.vllm_real import VLLMServer, vllm_args_for
    from simctl.executor.vllm_pinning import descendants
    from simctl.profiler.timing import CpuMonitor
    from simctl.results.metrics import summarise_result
    from simctl.studies.capacity import search_qps
    from simctl.validation.pipeline import REAL_REL_TOL, REAL_STEP, SIM_REL_TOL
    from simctl.validation.vllm_validate import VLLMValidation, check, simulate_requests

    v = VLLMValidation(cost=cost, out=out / "unused", repeats=rounds)
    fit, loads = check(v)
    report: dict = {"cost": cost, "rounds": rounds, "loads": {}, "probes": [], "capacities": []}
    with VLLMServer(v.model, vllm_args_for(v.model, v.workload.seed, v.settings)) as server:
        settings = server.settings()
        report["pinned"] = settings["pinned"]
        # the CPU of every process but vLLM's and this one, while each run is served
        monitor = CpuMonitor(own=tuple(p for p in descendants(os.getpid()) if p != os.getpid()))
        cap = search_qps(lambda q: simulate_requests(v.requests_at(q), settings, fit)[0], v.slo,
                         rel_tol=SIM_REL_TOL, max_probes=40)
        report["twin_capacity"] = cap.qps
        runs = {x: [] for x in loads}
        probe = [replace(r, arrival_s=0.0) for r in v.requests_at(1.0)[:PROBE_REQUESTS]]

        def speed() -> float:
            return summarise_result(server.serve(probe, v.workload.seed).result)["makespan_s"]

        for x in loads:  # warm-up, discarded
            server.serve(v.requests_at(x * cap.qps), v.workload.seed)
        for r in range(rounds):
            for x in loads:
                before = speed()
                c0, t0 = monitor.read(), time.perf_counter()
                s = summarise_result(server.serve(v.requests_at(x * cap.qps), v.workload.seed).result)
                foreign = monitor.foreign_share(c0, monitor.read(), time.perf_counter() - t0)
                after = speed()
                runs[x].append({m: s[m] for m in SHOWN} | {"probe_before_s": before, "probe_after_s": after,
                                                           "foreign_cpu_share": foreign})
                print(f"round {r + 1} load {x:g}: P50 ITL {s['tbt_p50'] * 1e3:.2f} ms, P50 E2E "
                      f"{s['e2e_p50'] * 1e3:.1f} ms, probe {before * 1e3:.1f} -> {after * 1e3:.1f} ms",
                      file=sys.stderr)
        for _ in range(capacities):
            t0 = time.perf_counter()
            real = search_qps(lambda q: summarise_result(server.serve(v.requests_at(q),
                                                                      v.workload.seed).result),
                              v.slo, start_qps=cap.qps, rel_tol=REAL_REL_TOL, max_probes=6, step=REAL_STEP)
            report["capacities"].append({"qps": real.qps, "problem": real.problem,
                                         "probes": [(p["qps"], p["slo_met"]) for p in real.probes],
                                         "wall_s": time.perf_counter() - t0})
            print(f"real capacity: {real.qps:.4g} QPS", file=sys.stderr)
    for x, rows in runs.items():
        probes = [(a["probe_before_s"] + a["probe_after_s"]) / 2 for a in rows]
        report["loads"][str(x)] = {
            "qps": x * cap.qps, "runs": rows,
            "spread_pct": {m: spread([a[m] for a in rows]) for m in SHOWN},
            "probe_vs_itl_rank_corr": rank_corr(probes, [a["tbt_p50"] for a in rows]),
            "probe_vs_e2e_rank_corr": rank_corr(probes, [a["e2e_p50"] for a in rows]),
            "foreign_vs_itl_rank_corr": rank_corr([a["foreign_cpu_share"] for a in rows],
                                                  [a["tbt_p50"] for a in rows]),
        }
    return report


def markdown(rep: dict, load: str, when: str) -> str:
    setup = (f"{when}. Cost model (for the twin's capacity, hence the loads) {rep['cost']}; twin capacity "
             f"{rep['twin_capacity']:.4g} QPS; {rep['rounds']} rounds after one discarded run per load; "
             f"vLLM's processes pinned (SIMCTL_VLLM_PIN): {rep.get('pinned') or 'no'}.")
    lines = ["# Real vLLM against itself: the noise floor of `simctl validate --engine vllm`", "", setup, "",
             "| load | metric | per round | spread (max-min)/median | largest pairwise |",
             "|---|---|---|---|---|"]
    for x, d in rep["loads"].items():
        for m in SHOWN:
            vals = [a[m] for a in d["runs"]]
            shown = ", ".join(f"{v:.4g}" if m.startswith("throughput") else f"{v * 1e3:.2f}" for v in vals)
            s, p = d["spread_pct"][m]
            lines.append(f"| {x} | {m} | {shown} | {s:.1f}% | {p:.1f}% |")
    lines += ["", "Speed probe makespans (ms, before -> after each load), rank correlation with the run:", ""]
    for x, d in rep["loads"].items():
        probes = "; ".join(f"{a['probe_before_s'] * 1e3:.1f}->{a['probe_after_s'] * 1e3:.1f}"
                           for a in d["runs"])
        foreign = ", ".join(f"{100 * a.get('foreign_cpu_share', float('nan')):.0f}%" for a in d["runs"])
        lines.append(f"- load {x}: {probes}; Spearman(probe, P50 ITL) {d['probe_vs_itl_rank_corr']}, "
                     f"(probe, P50 E2E) {d['probe_vs_e2e_rank_corr']}; foreign CPU during each run "
                     f"{foreign}, "
                     f"Spearman(foreign, P50 ITL) {d.get('foreign_vs_itl_rank_corr')}")
    caps = [c["qps"] for c in rep["capacities"]]
    capacity_spread = (f" (spread {100 * (max(caps) - min(caps)) / statistics.median(caps):.1f}%)"
                       if caps else "")
    lines += ["", f"Real capacities bisected: {', '.join(f'{c:.4g}' for c in caps)} QPS{capacity_spread}.",
              "", f"Machine load: {load}.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", required=True)
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--capacities", type=int, default=2)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    out = args.out or Path(tempfile.mkdtemp(prefix="simctl-vllm-noise-"))
    start = time.strftime("%H:%M:%S", time.gmtime())
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    rep = measure(args.cost, args.rounds, args.capacities, out)
    load1 = Path("/proc/loadavg").read_text().split()[:3]
    when = f"{start}-{time.strftime('%H:%M:%S', time.gmtime())} UTC"
    text = markdown(rep, f"averages {' '.join(load0)} at the start, {' '.join(load1)} at the end", when)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "vllm_noise.md").write_text(text, encoding="utf-8")
    (RESULTS / "vllm_noise.json").write_text(json.dumps(rep, indent=1, default=str) + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
