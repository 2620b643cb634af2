"""`simctl validate --engine vllm`: the simulated `vllm-v1` twin against the installed vLLM, side by side.

    report = validate_vllm(VLLMValidation(cost="profiles/vllm-tiny/cost_model.json", out="out/val-vllm"))

The stages and their constants are `validation.pipeline`'s, over vLLM as the target (`VLLMTarget`):

1. **One engine.** vLLM is started once (`engine.vllm_real.VLLMServer`); the settings it resolved configure
   the twin: policy `vllm-v1` with vLLM's block size, token budget, max_num_seqs, long-prefill threshold,
   prefix caching and KV blocks, at its max_model_len, priced by the fitted cost model of vLLM's own steps
   (`simctl profile --engine vllm`, then `simctl fit`).
2. **Twin capacity.** The highest rate whose simulated run meets the SLO (`studies.capacity.search_qps`);
   with closed-loop clients and no rate (`--concurrency`), the highest concurrency (`pipeline`), and each
   load is a number of clients (the report's `concurrency` where it has `qps`).
3. **Loads.** In each of `repeats` rounds, each load (a fraction of that capacity) is served for real and
   simulated on the identical requests (`traces.build_trace`: same trace, count, seed, scaled lengths and
   rate). Measured values are medians over the rounds (min and max kept). Errors are (sim - real) / real, raw
   and at the machine's speed during the run, as simctl's own validation measures it (`validation.compare`):
   each real run's busy time over the fit's price of the same steps (`run_speed`: the steps that continue a
   busy engine, their shapes read back from the requests vLLM gave a token in each, their periods between
   outputs) scales that run's twin (`costs.base.ScaledCost`). A run at the last load is served first and
   discarded (the first runs after the engine's start came slower). Also against the raw twin: the medians of
   the runs made at the fit's own speed (`pipeline.at_fit_speed`), where no scaling is needed: this VM's
   speed jumps between states ~30% apart (factors 0.99-1.43 within one validation).
4. **Real capacity** (`capacity=True`): the SLO bisected over real runs (`pipeline.real_capacity`).

Outputs in `out`: validation_vllm.json (everything), .md (the table), .csv (one row per load); each run's
files under `runs/load_<x>/{real,real_2,...,sim}/` and the real capacity probes under `capacity/qps_<q>/`.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import pandas as pd

from simctl.common.errors import InputError
from simctl.costs.base import CostModel, ScaledCost
from simctl.results.validation_report import fmt_err, metric_label, pct_error
from simctl.studies.capacity import SLO, CapacityResult, check_probe_requests
from simctl.traces.request import Request
from simctl.traces.workload import Workload
from simctl.validation import pipeline
from simctl.validation.pipeline import FIT_SPEED_TOL, Point, at_fit_speed, check_loads, check_repeats
from simctl.validation.target import ServedRun

if TYPE_CHECKING:
    from simctl.engine.vllm_real import VLLMRun, VLLMServer
    from simctl.results.run_result import SimResult

# scheduling delay (arrival to first scheduled step) splits TTFT into queueing and the prefill steps
METRICS = ("ttft_p50", "ttft_p90", "ttft_p99", "sched_delay_p50", "sched_delay_p90", "tpot_p50", "tpot_p90",
           "tpot_p99", "tbt_p50", "tbt_p90", "tbt_p99", "e2e_p50", "e2e_p90", "e2e_p99", "throughput_rps",
           "throughput_tokens_per_s")
# vLLM's bench names for the rows of the report (TBT pooled over every token is vLLM's ITL)
LABELS = {"ttft": "TTFT", "sched_delay": "sched delay", "tpot": "TPOT", "tbt": "ITL", "e2e": "E2E",
          "throughput_rps": "req/s",
          "throughput_tokens_per_s": "out tok/s"}
FILES = ("validation_vllm.json", "validation_vllm.md", "validation_vllm.csv")
DIRS = ("runs", "capacity")


@dataclass(frozen=True)
class VLLMValidation:
    """What a vLLM validation runs: the workload, the loads, the twin's cost model and vLLM's settings."""

    cost: str | CostModel | None = None  # the fitted cost model of vLLM's steps on this device
    out: str | Path = "out/validate-vllm"
    loads: tuple[float, ...] = (0.5, 0.7, 0.9)
    # its rate (qps) is each load's; 150 requests: each real run on vLLM's CPU build takes 150 / QPS seconds
    workload: Workload = field(default=Workload(trace="sharegpt", qps=None, num_requests=150, scale=0.05))
    model: str = "tiny"
    repeats: int = 1
    capacity: bool = False
    slo: SLO = field(default_factory=SLO)
    settings: dict[str, int | None] = field(default_factory=dict)  # vLLM's, by vLLM's names (vllm_args_for)

    def requests_at(self, qps: float) -> list[Request]:
        """The requests of a run at `qps`, as `simctl real` builds them."""
        return self.workload.at(qps).requests()

    @property
    def clients(self) -> dict[str, Any]:
        return clients_of(self.workload)


def clients_of(workload: Workload) -> dict[str, Any]:
    """How a run of `workload` sends its requests, for the real engine and its twin alike
    (`serving.clients.Clients`)."""
    return {"concurrency": workload.concurrency, "think_s": workload.think_time}


def simulate_requests(requests: list[Request], settings: dict[str, Any], cost: CostModel,
                      concurrency: int | None = None, think_s: float = 0.0) -> tuple[dict[str, Any], Any]:
    """The twin's prediction of serving `requests` on the engine `settings` describe (`VLLMServer.settings`:
    vllm-v1 with the engine's settings, on its KV blocks): (summary, SimResult)."""
    from simctl.policies.base import run_stats
    from simctl.results.metrics import summarise_result
    from simctl.serving.loop import overload_limit
    from simctl.sim.simulate import simulate
    from simctl.validation.twin import vllm_twin

    policy = vllm_twin(settings)
    result = simulate(requests, policy, cost, max_waiting=overload_limit([r.arrival_s for r in requests]),
                      concurrency=concurrency, think_s=think_s)
    return {"mode": "sim", "policy": policy.name, **policy.settings.as_dict(), **summarise_result(result),
            **run_stats([policy])}, result


def check(v: VLLMValidation) -> tuple[CostModel, list[float]]:
    """Every check that needs no engine: (the cost model, the loads); InputError in one line."""
    from simctl.catalogue.models import get_model
    from simctl.costs.loader import load_cost
    from simctl.results.output import check_out_dir

    loads = check_loads(v.loads)
    check_repeats(v.repeats)
    v.workload.at(1.0).validate()
    check_probe_requests(v.workload.num_requests)
    cost = load_cost(v.cost, get_model(v.model), None).cost
    engine = (getattr(cost, "meta", None) or {}).get("engine")
    if not isinstance(v.cost, CostModel) and engine != "vllm":
        raise InputError(f"--cost {v.cost}: a fit of simctl's own engine, not of vLLM's steps; profile with "
                         "`simctl profile --engine vllm`, then `simctl fit`")
    check_out_dir(Path(v.out), FILES, DIRS)
    return cost, loads


def _errors(real: dict[str, Any], sim: dict[str, Any], suffix: str = "") -> dict[str, float | None]:
    return {f"{m}_err_pct{suffix}": pct_error(sim.get(m), real.get(m)) for m in METRICS}


def _median_summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's median over the repeats (min and max kept: the run-to-run spread)."""
    out: dict[str, Any] = {}
    for m in METRICS:
        values = [r[m] for r in runs if r.get(m) is not None]
        out[m] = statistics.median(values) if values else None
        out[f"{m}_min"], out[f"{m}_max"] = (min(values), max(values)) if values else (None, None)
    return out


def validate_vllm(v: VLLMValidation, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Run the validation `v` describes and write its files; returns the report (what validation_vllm.json
    holds). InputError for bad input, before vLLM starts."""
    from simctl.engine.vllm_real import TWIN_POLICY
    from simctl.executor.vllm_runtime import require_vllm
    from simctl.validation.twin import cost_name

    say = log or (lambda _msg: None)
    require_vllm()
    cost, loads = check(v)
    t0 = time.perf_counter()
    out, rows = Path(v.out), []
    with VLLMTarget(v, cost, say) as target:
        plan = pipeline.Plan([TWIN_POLICY], loads, v.repeats, v.slo, out, v.capacity, v.workload,
                             (*FILES, *DIRS))
        found = pipeline.run(target, plan, lambda point, runs: rows.append(_row(point, runs, target, out)),
                             say)
    capacity, real = found.twin[TWIN_POLICY], found.real.get(TWIN_POLICY)
    report = {
        "config": {**v.workload.recorded(),
                   **{k: x for k, x in asdict(v).items() if k not in ("cost", "out", "workload")},
                   "cost": cost_name(v.cost), "out": str(out), "engine": target.settings(),
                   "wall_s": time.perf_counter() - t0},
        "speed_factors": found.speeds(),
        "capacity": {f"sim_{capacity.variable}": capacity.qps, "sim_probes": len(capacity.probes),
                     **(_capacity_row(capacity, real) if real else {})},
        "rows": rows,
    }
    _write_report(out, report)
    return report


@dataclass
class VLLMTarget:
    """The installed vLLM as a validation target (`validation.target.Target`): started once, every run served
    by the same engine; its twin `vllm-v1` configured from the settings it resolved, priced by `cost`."""

    v: VLLMValidation
    cost: CostModel
    say: Callable[[str], None]
    server: VLLMServer | None = None  # started on entering
    resolved: dict[str, Any] = field(default_factory=dict)
    stack: ExitStack = field(default_factory=ExitStack)
    warm_up: bool = True  # the first runs after the engine's start came slower

    def __enter__(self) -> Self:
        from simctl.engine.vllm_real import VLLMServer, vllm_args_for

        v = self.v
        with ExitStack() as starting:
            self.server = starting.enter_context(
                VLLMServer(v.model, vllm_args_for(v.model, v.workload.seed, v.settings)))
            self.resolved = self.server.settings()
            self.server.check(v.requests_at(1.0))
            self.stack = starting.pop_all()  # started: stopped by __exit__
        s = self.resolved
        self.say(f"vLLM started in {s['engine_start_s']:.0f} s: {s['num_gpu_blocks']} KV blocks of "
                 f"{s['block_size']}, token budget {s['max_num_batched_tokens']}")
        return self

    def __exit__(self, *exc: object) -> None:
        self.stack.close()

    def settings(self) -> dict[str, Any]:
        return self.resolved

    def folder(self, policy: str) -> str:
        return ""  # one policy: its twin's

    def twin(self, policy: str, workload: Workload, cost: CostModel | None = None) -> dict[str, Any]:
        """The twin's summary of a run of `workload`, priced by `cost` (default: the fit's)."""
        price = self.cost if cost is None else cost
        return simulate_requests(workload.requests(), self.resolved, price, **clients_of(workload))[0]

    def serve(self, policy: str, workload: Workload, out: Path | None) -> ServedRun:
        """A real run of `workload`, written to `out` as `simctl real --engine vllm` writes it, and the
        machine's speed during it (`run_speed`)."""
        w = workload
        if out is None:
            self.server.serve(w.requests(), w.seed, **clients_of(w))
            return ServedRun({})
        t0 = time.perf_counter()
        run = self.server.serve(w.requests(), w.seed, members=True, **clients_of(w))
        summary = _write_real(self.v, w, self.server, run, time.perf_counter() - t0, out)
        speed = run_speed(run, self.cost)
        at = pipeline.describe(pipeline.variable_of(w), pipeline.value_of(w))
        self.say(f"  {at}: P50 TTFT {summary['ttft_p50']:.3f} s, P50 ITL "
                 f"{summary['tbt_p50'] * 1e3:.1f} ms, machine speed factor "
                 f"{'-' if speed is None else f'{speed:.2f}'}")
        return ServedRun(summary, speed)


def run_speed(run: VLLMRun, cost: CostModel) -> float | None:
    """The machine's speed during a served `run` (recorded with its members) against the one `cost` was
    fitted on: the periods of its steps that continue a busy engine over `cost`'s price of their shapes
    (`simctl.profiler.vllm_stream.stream_steps`); None if no step counts."""
    from simctl.profiler.vllm_stream import stream_steps

    steps, _ = stream_steps(run, {r.id: r.prompt_tokens for r in run.requests})
    price = sum(cost.iteration_time(s.plan()) for s in steps)
    return sum(s.period_s for s in steps) / price if price > 0 else None


def _row(point: Point, runs: list[ServedRun], target: VLLMTarget, out: Path) -> dict[str, Any]:
    """One load's row of the report: the medians of its real runs, the twin raw and at each run's machine
    speed, and their errors; the twin's run written to `out`."""
    load, w = point.load, point.workload
    sim, result = simulate_requests(w.requests(), target.resolved, target.cost, **clients_of(w))
    _write_sim(out / "runs" / f"load_{load:g}" / "sim", sim, result)
    measured = _median_summary([r.summary for r in runs])
    at_speed = _median_summary([target.twin(point.policy, w, ScaledCost(target.cost, r.speed))
                                for r in runs if r.speed is not None])
    at_fit = [r.summary for r in at_fit_speed(runs)]
    return {"load": load, point.variable: point.value,
            **{f"real_{k}": x for k, x in measured.items()},
            **{f"sim_{m}": sim.get(m) for m in METRICS}, **_errors(measured, sim),
            **_errors(measured, at_speed, "_at_speed"),
            "runs_at_fit_speed": len(at_fit),
            **_errors(_median_summary(at_fit), sim, "_at_fit_speed"),
            **_hit_rates(runs[0].summary.get("prefix_cache_hit_rate"), sim.get("prefix_cache_hit_rate"))}


def _hit_rates(real: float | None, sim: float | None) -> dict[str, float | None]:
    """The prefix cache's token hit rates, vLLM's counters and the twin's, and the twin's error in points."""
    err = None if real is None or sim is None else 100 * (sim - real)
    return {"prefix_cache_hit_rate_real": real, "prefix_cache_hit_rate_sim": sim,
            "prefix_cache_hit_rate_err_pts": err}


def _write_real(v: VLLMValidation, workload: Workload, server: VLLMServer, run: VLLMRun, wall_s: float,
                where: Path) -> dict[str, Any]:
    """A real run's files, as `simctl real --engine vllm` writes them; its summary."""
    from simctl.engine.setup import RealConfig
    from simctl.engine.vllm_real import run_summary
    from simctl.results.output import write_run

    config = RealConfig(policy="vllm", workload=workload, model=v.model)
    summary = run_summary(config, server, run, wall_s)
    write_run(where, summary, run.result.requests, run.result.iterations.frame())
    return summary


def _write_sim(where: Path, summary: dict[str, Any], result: SimResult) -> None:
    from simctl.results.output import write_run

    write_run(where, summary, result.requests, result.iterations.frame())


def _capacity_row(sim: CapacityResult, real: CapacityResult) -> dict[str, Any]:
    var = real.variable
    probes = [{var: p[var], "slo_met": p["slo_met"]} for p in real.probes]
    return {f"real_{var}": real.qps, "real_probes": probes, "real_problem": real.problem,
            "err_pct": pct_error(sim.qps, real.qps) if not real.problem else None}


def markdown(report: dict[str, Any]) -> str:
    """The report's table: per load, each metric measured (median of the rounds), predicted and the error,
    raw, at the machine's speed, and against the runs made at the fit's speed."""
    cfg, cap = report["config"], report["capacity"]
    eng = cfg["engine"]
    setup = (f"{eng['vllm_version']} on {cfg['model']} (random weights, {eng['dtype']}), {cfg['trace']} x "
             f"{cfg['scale']}, {cfg['num_requests']} requests per run, {cfg['repeats']} round(s); KV "
             f"{eng['num_gpu_blocks']} blocks of {eng['block_size']}, token budget "
             f"{eng['max_num_batched_tokens']}, max_num_seqs {eng['max_num_seqs']}, prefix caching "
             f"{'on' if eng['enable_prefix_caching'] else 'off'}; cost model {cfg['cost']}.")
    var, unit = ("qps", "QPS") if "sim_qps" in cap else ("concurrency", "clients")
    capacity = f"Twin capacity {cap[f'sim_{var}']:.3g} {unit}"
    if f"real_{var}" in cap:
        capacity += f"; real capacity {cap[f'real_{var}']:.3g} {unit} (error {fmt_err(cap.get('err_pct'))})"
    speeds = ", ".join("-" if s is None else f"{s:.2f}" for s in report["speed_factors"])
    lines = ["# simctl's vllm-v1 twin vs the real vLLM engine", "", setup, "",
             (f"{capacity}. Machine speed factors (each run's busy time over the fit's price of its steps, "
              f"rounds of loads in order; `run_speed`): {speeds}."), "",
             ("| load | metric | real (median) | real min..max | sim | error | error at machine speed | "
              f"error, runs at the fit's speed (+-{FIT_SPEED_TOL:.0%}) |"),
             "|---|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        n = row["runs_at_fit_speed"]
        for m in METRICS:
            lines.append(f"| {row['load']:g} | {metric_label(m, LABELS)} | {_fmt(m, row[f'real_{m}'])} | "
                         f"{_fmt(m, row[f'real_{m}_min'])}..{_fmt(m, row[f'real_{m}_max'])} | "
                         f"{_fmt(m, row[f'sim_{m}'])} | {fmt_err(row[f'{m}_err_pct'])} | "
                         f"{fmt_err(row[f'{m}_err_pct_at_speed'])} | "
                         f"{fmt_err(row[f'{m}_err_pct_at_fit_speed'])} ({n} of {cfg['repeats']}) |")
        if row.get("prefix_cache_hit_rate_err_pts") is not None:
            lines.append(f"| {row['load']:g} | prefix-cache hit rate | "
                         f"{row['prefix_cache_hit_rate_real']:.2%} | - | "
                         f"{row['prefix_cache_hit_rate_sim']:.2%} | "
                         f"{row['prefix_cache_hit_rate_err_pts']:+.2f} points | - | - |")
    lines.append("")
    return "\n".join(lines)


def _fmt(metric: str, value: float | None) -> str:
    if value is None or not math.isfinite(value):
        return "-"
    if metric.startswith("throughput"):
        return f"{value:.3g}"
    return f"{value * 1e3:.1f} ms" if value < 1 else f"{value:.2f} s"


def _write_report(out: Path, report: dict[str, Any]) -> None:
    from simctl.results.output import json_text, write_files
    from simctl.results.validation_report import jsonable

    text = json_text(jsonable(report))
    md = markdown(report)
    frame = pd.DataFrame(report["rows"])
    write_files(out, {
        "validation_vllm.json": lambda p: p.write_text(text, encoding="utf-8"),
        "validation_vllm.md": lambda p: p.write_text(md, encoding="utf-8"),
        "validation_vllm.csv": lambda p: frame.to_csv(p, index=False),
    }, "the vLLM validation report")
