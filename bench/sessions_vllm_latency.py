"""Latency of the vllm-v1 twin against real vLLM on generated sessions (issue 37, target (a)'s latency part):
`--trace sessions` served by closed-loop clients on a KV cache smaller than the sessions' working set, at the
concurrencies given, each real run's twin priced by the fit of vLLM's steps on this machine (`simctl profile
--engine vllm`, `simctl fit`).

It serves each concurrency as `simctl validate --engine vllm` serves a point (its target,
`validation.vllm_validate.VLLMTarget`: a discarded first run, then `--repeats` real runs, each one's twin at
the machine's speed during it, `run_speed`) on a vLLM engine sized here (`--kv-blocks`: validate takes vLLM's
default KV, which holds this workload whole, and searches a capacity, which these sessions do not reach within
a run's turns). Reported per concurrency: the
medians of the real runs, the twin raw and at machine speed (the median of the scaled twins), their errors,
the speed factors, vLLM's and the twin's prefix-cache hit rates, and the machine's load averages before and
after. `--sweep`: one real run and the raw twin per concurrency, for where throughput stops growing.

    PYTHONPATH=. .venv/bin/python bench/sessions_vllm_latency.py --cost FIT --sweep \
        --concurrency 4 8 12 16 24 32
    PYTHONPATH=. .venv/bin/python bench/sessions_vllm_latency.py --cost FIT --concurrency 4 6 --repeats 3 \\
        --out bench/results/sessions.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from sessions_vllm import load_averages, write_section

from simctl.catalogue.models import get_model
from simctl.costs.base import ScaledCost
from simctl.costs.loader import load_cost
from simctl.engine.vllm_real import CPU_BLOCK_SIZE, VLLMServer, vllm_args_for
from simctl.results.validation_report import pct_error
from simctl.traces.workload import Workload
from simctl.validation.pipeline import Point, serve_rounds
from simctl.validation.vllm_validate import VLLMTarget, VLLMValidation, simulate_requests

SECTION = "## Latency on generated sessions, real vLLM vs the twin"
METRICS = ("ttft_p50", "tbt_p50", "e2e_p50", "sched_delay_p50", "tpot_p50", "throughput_rps",
           "throughput_tokens_per_s")
LABELS = {"ttft_p50": "P50 TTFT", "tbt_p50": "P50 ITL", "e2e_p50": "P50 E2E",
          "sched_delay_p50": "P50 sched delay",
          "tpot_p50": "P50 TPOT", "throughput_rps": "req/s", "throughput_tokens_per_s": "out tok/s"}


def workload(args: argparse.Namespace, concurrency: int) -> Workload:
    return Workload(trace="sessions", qps=args.qps, num_requests=args.num_requests, seed=args.seed,
                    scale=args.scale, concurrency=concurrency, system_prompt_tokens=args.system_prompt_tokens,
                    system_prompts=args.system_prompts, session_think_time=args.session_think_time)


def median(runs: list[dict[str, Any]], metric: str) -> float | None:
    values = [r[metric] for r in runs if r.get(metric) is not None]
    return statistics.median(values) if values else None


def measure(server: Any, settings: dict[str, Any], cost: Any, args: argparse.Namespace, n: int,
            out: Path) -> dict[str, Any]:
    """One concurrency served as the validation serves a point (`pipeline.serve_rounds`: a discarded run,
    then `--repeats` real runs), each run beside the twin at its machine speed; and the twin at the fit's."""
    w = workload(args, n)
    v = VLLMValidation(cost=cost, out=out, loads=(1.0,), workload=w, repeats=args.repeats)

    def say(line: str) -> None:
        print(f"c={n} {line}", flush=True)

    target = VLLMTarget(v, cost, say, server=server, resolved=settings)  # the bench's server, KV sized here
    before = load_averages()
    point = Point("vllm-v1", 1.0, n, w)
    served = serve_rounds(target, [point], args.repeats, out / f"c{n}", say)[point]
    real = [r.summary for r in served]
    scaled = [target.twin("vllm-v1", w, ScaledCost(cost, r.speed)) for r in served if r.speed is not None]
    sim = target.twin("vllm-v1", w)
    row: dict[str, Any] = {"concurrency": n, "load_before": before, "load_after": load_averages(),
                           "speeds": [r.speed for r in served], "runs": len(real),
                           "hit_rate_real": [r.get("prefix_cache_hit_rate") for r in real],
                           "hit_rate_sim": sim.get("prefix_cache_hit_rate")}
    for m in METRICS:
        row[f"real_{m}"] = median(real, m)
        row[f"real_{m}_all"] = [r.get(m) for r in real]
        row[f"sim_{m}"], row[f"scaled_{m}"] = sim.get(m), median(scaled, m)
        row[f"{m}_err_pct"] = pct_error(sim.get(m), row[f"real_{m}"])
        row[f"{m}_err_pct_at_speed"] = pct_error(row[f"scaled_{m}"], row[f"real_{m}"])
    return row


def sweep(server: Any, settings: dict[str, Any], cost: Any, args: argparse.Namespace,
          concurrencies: list[int]) -> list[dict[str, Any]]:
    """--sweep: after one discarded run, one real run per concurrency beside the raw twin's prediction."""
    from simctl.results.metrics import summarise_result

    v = VLLMValidation(cost=cost, workload=workload(args, concurrencies[-1]))
    server.serve(v.requests_at(args.qps), args.seed, **v.clients)
    rows = []
    for n in concurrencies:
        v = VLLMValidation(cost=cost, workload=workload(args, n))
        requests, before = v.requests_at(args.qps), load_averages()
        run = server.serve(requests, args.seed, **v.clients)
        real = {**summarise_result(run.result), **run.fields}
        sim, _ = simulate_requests(requests, settings, cost, **v.clients)
        rows.append({"concurrency": n, "load_before": before, "load_after": load_averages(),
                     **{f"real_{m}": real.get(m) for m in METRICS},
                     **{f"sim_{m}": sim.get(m) for m in METRICS},
                     "hit_rate_real": real.get("prefix_cache_hit_rate"),
                     "hit_rate_sim": sim.get("prefix_cache_hit_rate")})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def sweep_table(rows: list[dict[str, Any]]) -> str:
    lines = [SECTION + " (sweep)", "",
             (f"{command()} ({datetime.date.today()}; one real run per concurrency after a discarded one)."),
             "",
             ("| concurrency | real req/s | twin req/s | real out tok/s | twin out tok/s | real P50 TTFT | "
              "twin P50 TTFT | real P50 ITL | twin P50 ITL | load averages before, after |"),
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rows:
        cells = [r["concurrency"]] + [_ms(f"{m}", r[f"{who}_{m}"]) for m in METRICS[5:] + METRICS[:2]
                                      for who in ("real", "sim")]
        cells.append(f"{r['load_before']}; {r['load_after']}")
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def command() -> str:
    return f"`PYTHONPATH=. .venv/bin/python bench/sessions_vllm_latency.py {' '.join(sys.argv[1:])}`"


def _ms(metric: str, x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.3g}" if metric.startswith("throughput") else f"{x * 1e3:.1f} ms"


def _err(x: float | None) -> str:
    return "-" if x is None else f"{x:+.1f}%"


def table(rows: list[dict[str, Any]], settings: dict[str, Any], args: argparse.Namespace) -> str:
    kv = settings["num_gpu_blocks"] - 1  # vLLM's null block holds no request's tokens
    lines = [SECTION, "",
             (f"{command()} ({datetime.date.today()}; {settings['vllm_version']}, tiny, KV {kv} blocks of "
              f"{settings['block_size']} for requests, token budget {settings['max_num_batched_tokens']}, "
              f"{args.num_requests} turns per run; medians over {args.repeats} real runs after a discarded "
              "one; errors (twin - real) / real, raw and with the twin at each run's machine speed)."), "",
             ("| concurrency | metric | real (median) | real runs | twin | error | twin at machine speed | "
              "error at machine speed |"), "|---:|---|---:|---|---:|---:|---:|---:|"]
    for r in rows:
        for m in METRICS:
            runs = ", ".join(_ms(m, x) for x in r[f"real_{m}_all"])
            lines.append(f"| {r['concurrency']} | {LABELS[m]} | {_ms(m, r[f'real_{m}'])} | {runs} | "
                         f"{_ms(m, r[f'sim_{m}'])} | {_err(r[f'{m}_err_pct'])} | "
                         f"{_ms(m, r[f'scaled_{m}'])} | {_err(r[f'{m}_err_pct_at_speed'])} |")
    lines.append("")
    for r in rows:
        hits = ", ".join("-" if h is None else f"{h:.2%}" for h in r["hit_rate_real"])
        speeds = ", ".join("-" if s is None else f"{s:.2f}" for s in r["speeds"])
        sim_hits = "-" if r["hit_rate_sim"] is None else f"{r['hit_rate_sim']:.2%}"
        lines.append(f"- concurrency {r['concurrency']}: load averages {r['load_before']} before, "
                     f"{r['load_after']} after; speed factors {speeds}; hit rate vLLM {hits}, "
                     f"twin {sim_hits}.")
    return "\n".join(lines) + "\n"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cost", required=True, help="cost_model.json of `simctl fit` on a vLLM profile")
    p.add_argument("--concurrency", type=int, nargs="+", required=True)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--sweep", action="store_true",
                   help="one run per concurrency: where throughput stops growing")
    p.add_argument("--num-requests", type=int, default=300, help="turns per run")
    p.add_argument("--qps", type=float, default=100.0, help="sessions per second (high: the clients bound)")
    p.add_argument("--scale", type=float, default=0.25)
    p.add_argument("--system-prompt-tokens", type=int, default=1024)
    p.add_argument("--system-prompts", type=int, default=4)
    p.add_argument("--session-think-time", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--kv-blocks", type=int, default=32, help="KV blocks for requests")
    p.add_argument("--runs", type=Path, default=Path("out/sessions-latency"), help="each run's files")
    p.add_argument("--out", type=Path, help="markdown file to write the section into")
    args = p.parse_args()
    cost = load_cost(args.cost, get_model("tiny"), None).cost
    deployment = vllm_args_for("tiny", args.seed, {"block_size": CPU_BLOCK_SIZE},
                                kv_capacity=args.kv_blocks * CPU_BLOCK_SIZE)
    t0, rows = time.perf_counter(), []
    with VLLMServer("tiny", deployment) as server:
        settings = server.settings()
        if args.sweep:
            rows = sweep(server, settings, cost, args, args.concurrency)
        for n in [] if args.sweep else args.concurrency:
            rows.append(measure(server, settings, cost, args, n, args.runs))
            print(json.dumps({k: x for k, x in rows[-1].items() if not k.endswith("_all")}), flush=True)
    args.runs.mkdir(parents=True, exist_ok=True)
    (args.runs / ("sweep.json" if args.sweep else "rows.json")).write_text(
        json.dumps({"settings": settings, "rows": rows, "wall_s": time.perf_counter() - t0}, indent=1))
    text = sweep_table(rows) if args.sweep else table(rows, settings, args)
    print(text)
    if args.out is not None:
        write_section(args.out, text, SECTION + (" (sweep)" if args.sweep else ""))


if __name__ == "__main__":
    main()
