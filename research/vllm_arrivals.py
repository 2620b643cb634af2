"""Does a request's arrival cost served vLLM's step, or does it overlap the model's compute?

Serves the profile's request streams (`profiler.vllm_stream`: the same trace, seed, rates and counting rule)
and splits every counting step's period (its outputs' engine-core time minus the previous step's) into the
model's execution as the engine core timed it (`elapsed_ms`: from launching the step to its result) and the
rest (the gap: output processing, the input queue, scheduling). Each step's arrivals are split the same way:
submitted during the gap (between the previous step's outputs and this step's launch) or during the
execution. Robust least squares (as `fit_stream`: soft L1 at 0.5 ms) of the period's excess over the fit's
price, of the execution and of the gap, on a per-step and a per-row term (controls), the step's prompt
tokens, its requests scheduled for the first time, and the arrivals during the gap and during the execution.

If arrivals during the execution add nothing to the period, the front end's work on them overlaps the
model's and the twin's arrival term (charged in a step's price) overcharges busy steps.

    .venv/bin/python research/vllm_arrivals.py --cost FIT [--out research/results/vllm_arrivals.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TERMS = ("step", "row", "prefill_token", "new", "arrival_gap", "arrival_exec")


def step_rows(run, prompts: dict[int, int]) -> list[dict]:
    """Each counting step (`profiler.vllm_stream.stream_steps`' rule) with its execution, gap and arrivals
    split at its launch."""
    from simctl.profiler.vllm_stream import StreamStep

    it = run.result.iterations.frame()
    start = it.start_s.to_numpy()
    ends = start + it.duration_s.to_numpy()
    arrivals = np.sort([r.arrival_s for r in run.requests])
    at_end = np.searchsorted(arrivals, ends, side="right")
    at_start = np.searchsorted(arrivals, start, side="right")
    rows = []
    for k in range(1, len(ends)):
        decodes = tuple(prompts[rid] + n - 1 for rid, n in run.members[k] if n > 0)
        fills = tuple(prompts[rid] for rid, n in run.members[k] if n == 0)
        if not (decodes and len(decodes) == it.decode_tokens.iat[k] and sum(fills) == it.prefill_tokens.iat[k]
                and ends[k] > ends[k - 1] and start[k] >= ends[k - 1]):
            continue
        step = StreamStep(float(ends[k] - ends[k - 1]), decodes, fills, len(fills),
                          int(at_end[k] - at_end[k - 1]))
        rows.append({"step": step, "exec_s": float(ends[k] - start[k]),
                     "arrival_gap": int(at_start[k] - at_end[k - 1]),
                     "arrival_exec": int(at_end[k] - at_start[k])})
    return rows


def regress(x: np.ndarray, y: np.ndarray) -> list[float]:
    from simctl.profiler.vllm_stream import robust_lstsq

    return [float(v) for v in robust_lstsq(x, y)]


def measure(cost_path: str, seed: int = 0) -> dict:
    from dataclasses import replace

    from simctl.catalogue.models import get_model
    from simctl.costs.loader import load_cost
    from simctl.engine.vllm_real import VLLMServer, vllm_args_for
    from simctl.profiler.vllm_stream import (
        CLOSED_BATCH,
        SEED_OFFSET,
        STREAM_LOADS,
        STREAM_REPEATS,
        STREAM_REQUESTS,
        STREAM_SCALE,
        STREAM_TRACE,
    )
    from simctl.results.metrics import summarise_result
    from simctl.traces.build import build_trace

    cost = load_cost(cost_path, get_model("tiny"), None).cost

    def requests(qps: float) -> list:
        return build_trace(STREAM_TRACE, STREAM_REQUESTS, qps, seed + SEED_OFFSET, scale=STREAM_SCALE)

    rows: list[dict] = []
    with VLLMServer("tiny", vllm_args_for("tiny", seed, {})) as server:
        pinned = server.settings()["pinned"]
        closed = [replace(r, arrival_s=0.0) for r in requests(1.0)[:CLOSED_BATCH]]
        rps = CLOSED_BATCH / summarise_result(server.serve(closed, seed).result)["makespan_s"]
        for load in STREAM_LOADS:
            for _ in range(STREAM_REPEATS):
                reqs = requests(load * rps)
                run = server.serve(reqs, seed, members=True)
                rows += step_rows(run, {r.id: r.prompt_tokens for r in reqs})
    steps = [r["step"] for r in rows]
    x = np.array([[1.0, len(s.decode_contexts) + s.new, sum(s.prefills), s.new, r["arrival_gap"],
                   r["arrival_exec"]] for s, r in zip(steps, rows)])
    period = np.array([r["step"].period_s for r in rows])
    exec_s = np.array([r["exec_s"] for r in rows])
    price = np.array([cost.iteration_time(r["step"].plan()) for r in rows])
    fits = {name: dict(zip(TERMS, regress(x, y))) for name, y in
            (("period_excess", period - price), ("exec", exec_s), ("gap", period - exec_s))}
    return {"cost": cost_path, "closed_batch_rps": rps, "pinned": pinned, "steps": len(rows),
            "arrivals_gap": int(x[:, 4].sum()), "arrivals_exec": int(x[:, 5].sum()),
            "median_period_s": float(np.median(period)), "median_exec_s": float(np.median(exec_s)),
            "fits": fits}


def validation_steps(cost_path: str, fractions: list[float], seed: int = 0) -> dict:
    """The validation's own requests (`bench/validate_vllm.py`'s workload) at `fractions` of the twin's
    capacity: per load, the counting steps' served periods against the fit's price of the same shapes."""
    import tempfile

    from simctl.engine.vllm_real import VLLMServer, vllm_args_for
    from simctl.studies.capacity import search_qps
    from simctl.validation.pipeline import SIM_REL_TOL
    from simctl.validation.vllm_validate import VLLMValidation, check, simulate_requests

    v = VLLMValidation(cost=cost_path, out=Path(tempfile.mkdtemp()) / "unused", repeats=1)
    fit, _ = check(v)
    out = {}
    with VLLMServer(v.model, vllm_args_for(v.model, v.workload.seed, v.settings)) as server:
        settings = server.settings()
        cap = search_qps(lambda q: simulate_requests(v.requests_at(q), settings, fit)[0], v.slo,
                         rel_tol=SIM_REL_TOL, max_probes=40).qps
        for x in fractions:
            reqs = v.requests_at(x * cap)
            server.serve(reqs, v.workload.seed)  # warm-up at this load, discarded
            rows = step_rows(server.serve(reqs, v.workload.seed, members=True),
                             {r.id: r.prompt_tokens for r in reqs})
            period = np.array([r["step"].period_s for r in rows])
            price = np.array([fit.iteration_time(r["step"].plan()) for r in rows])
            out[str(x)] = {"qps": x * cap, "steps": len(rows),
                           "period_over_price": float(period.sum() / price.sum()),
                           "median_period_s": float(np.median(period)),
                           "median_price_s": float(np.median(price)),
                           "median_excess_s": float(np.median(period - price)),
                           "rows_median": float(np.median([len(r["step"].decode_contexts) for r in rows])),
                           "by_rows": _by_rows(rows, period, price)}
    return out


ROW_BINS = ((1, 8), (9, 16), (17, 32), (33, 64), (65, 1 << 30))  # decode rows + prompts in a step


def _by_rows(rows: list[dict], period: np.ndarray, price: np.ndarray) -> list[dict]:
    """Served over priced time of the steps of each size (ROW_BINS), summed and weighted by the tokens the
    steps gave (a token-weighted latency such as ITL sees the second)."""
    size = np.array([len(r["step"].decode_contexts) + r["step"].new for r in rows])
    out = []
    for lo, hi in ROW_BINS:
        k = (size >= lo) & (size <= hi)
        if k.any():
            out.append({"rows": f"{lo}-{hi}" if hi < 1 << 30 else f"{lo}+", "steps": int(k.sum()),
                        "period_over_price": float(period[k].sum() / price[k].sum()),
                        "token_weighted": float((size[k] * period[k]).sum() / (size[k] * price[k]).sum())})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cost", required=True)
    ap.add_argument("--out", type=Path, default=ROOT / "research" / "results" / "vllm_arrivals.json")
    ap.add_argument("--validation", help="fractions of the twin's capacity (e.g. 0.5,0.7,0.9): price the "
                    "validation's served steps instead of regressing the streams")
    args = ap.parse_args()
    if args.validation:
        load0 = Path("/proc/loadavg").read_text().split()[:3]
        t0 = time.strftime("%H:%M:%S", time.gmtime())
        rep = validation_steps(args.cost, [float(x) for x in args.validation.split(",")])
        when = f"{t0}-{time.strftime('%H:%M:%S', time.gmtime())} UTC"
        rep = {"cost": args.cost, "loads": rep, "when": when,
               "load": [load0, Path("/proc/loadavg").read_text().split()[:3]]}
        args.out.write_text(json.dumps(rep, indent=1) + "\n", encoding="utf-8")
        print(json.dumps(rep, indent=1))
        return
    load0 = Path("/proc/loadavg").read_text().split()[:3]
    t0 = time.strftime("%H:%M:%S", time.gmtime())
    rep = measure(args.cost)
    rep["when"] = f"{t0}-{time.strftime('%H:%M:%S', time.gmtime())} UTC"
    rep["load"] = [load0, Path("/proc/loadavg").read_text().split()[:3]]
    args.out.write_text(json.dumps(rep, indent=1) + "\n", encoding="utf-8")
    for name, f in rep["fits"].items():
        print(name, " ".join(f"{k} {v * 1e6:.0f}us" for k, v in f.items()))
    print({k: v for k, v in rep.items() if k != "fits"})


if __name__ == "__main__":
    main()
