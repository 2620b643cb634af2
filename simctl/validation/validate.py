"""`simctl validate`: check the simulator against real execution on this machine's CPU or GPU.

    report = validate_main(["sarathi", "vllm"], DEFAULT_WORKLOAD, [0.5, 0.7], cost="cost_model.json",
                           out="out/val")

The stages and their constants are `validation.pipeline`'s, over simctl's engine as the target
(`validation.engine_target.SimctlEngine`); for each policy:

1. **Simulated capacity on the twin setup.** The highest QPS whose *simulated* run meets the SLO (default:
   sustainable and median scheduling delay <= 2 s; optionally P99 TBT), by bisection over QPS (closed-loop
   clients without a rate: over the concurrency, the rows and capacities in clients). Every probe
   is the run a real run at that rate would be: the same request generator (`traces.build_trace`:
   trace, count, seed, scaled lengths), the same KV sizing (`engine.setup.size_run` on the real runs' slab
   budget), the policy rebuilt by `validation.twin.twin_inputs`, priced by the fitted cost model.
2. **Loads.** For each load (a fraction of that capacity) `repeats` real runs (`engine.real.real_main`, a
   child process each) and the simulator on the identical requests (`twin_inputs(summary)`): signed errors
   (sim - real) / real of P50/P90/P99 TTFT, TBT and E2E and of throughput (requests/s, output tokens/s), the
   measured value of each metric being its median over the repeats (their min and max are kept: the
   run-to-run spread). Repeats run in rounds (every policy and load once per round).
3. **Real capacity** (`capacity=True`): the same SLO bisected with at most `MAX_REAL_PROBES` real runs,
   starting at the simulated capacity (or, if a real run at a load already missed the SLO, at the highest
   load rate that met it) and bracketing by factors of `REAL_STEP`; capacity error = (sim - real) / real
   against the highest real rate that met the SLO.
4. **Per-iteration evidence.** The real run's iterations are *replayed*: its policy is rebuilt, handed each
   arrival before the first iteration that started after it, and asked to schedule at each logged iteration
   start -- policies are deterministic and never read a clock, so it plans exactly the batches the engine ran
   (checked against the logged prefill/decode tokens, batch size and linear tokens). Each replayed plan is
   priced by the cost model (with its term breakdown) next to its measured duration, and the bookkeeping,
   run with the real start/end times, rebuilds the real run's TBT gaps (they are not in its files) for the
   CDFs. The time the engine spends *between* iterations while work is pending (argmax sampling,
   bookkeeping) is measured too: the simulator has no such term.

Outputs in `out`: validation.csv (one row per policy and load), validation.md, validation.png (predicted vs
measured CDFs of TTFT and TBT), validation.json (everything, with the capacity probes and the per-iteration
evidence), and per run `runs/<policy>/load_<x>/{real,sim}/` (summary.json, requests.parquet,
iterations.parquet; further repeats in `real_2/`, `real_3/`, ...) with `replay.parquet` (measured vs predicted
per iteration, every repeat's, with a `repeat` column) beside them;
real capacity probes under `capacity/<policy>/qps_<q>/`.

`rescore(validation, cost, out)` scores another cost model against the real runs of a finished validation in
seconds (nothing real is run): for iterating on a cost model without minutes of noisy real runs.

Defaults: sharegpt x 0.05 (median prompt ~80 tokens, output ~20) and 300 requests per run. Fewer requests
and the whole trace is served before a 2 s median scheduling delay can build, at any rate (60 requests: the
simulated vLLM meets the SLO at 5e11 QPS): the capacity would not exist. With 300, every policy's simulated
capacity is within ~20% of its saturation throughput, and `--policy all --loads 0.5,0.7` takes ~4 minutes
here (each real run: ~4 s of child start-up plus 300 / QPS seconds).

Devices (`device`, `dtype`): the real runs run on the CPU or a CUDA device, in a dtype; the cost model must
have been profiled on that device in that dtype (`costs.provenance.check_fitted_run`: the kind of device
and the dtype are checked before anything runs, a GPU's name once it is probed). On the CPU the KV slab budget
is `engine.real.CPU_KV_BYTES`; on cuda it depends on the free device memory, so it is measured once, in a
child that builds the model as a real run does (`simctl.engine.real.probe_device`, which also fails for cuda
missing), and handed to every real run: the twins and the simulated capacities are sized on the budget the
real runs use, whatever the free memory does between runs. The device, its name and the dtype are recorded
in validation.json (`config`) and the report.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.costs.loader import load_cost
from simctl.costs.provenance import check_fitted_run, fitted_dtype
from simctl.results.validation_report import (
    VALIDATION_FILES,
    ValidationReport,
    load_report,
    pct_error,
)
from simctl.studies.capacity import SLO, check_probe_requests
from simctl.traces.workload import Workload
from simctl.validation import pipeline
from simctl.validation.compare import compare_run
from simctl.validation.engine_target import SimctlEngine
from simctl.validation.findings import Comparisons, Findings, capacities
from simctl.validation.machine_load import loadavg
from simctl.validation.pipeline import bracket, check_loads, check_repeats, real_dirs, remove_earlier
from simctl.validation.report import write_report
from simctl.validation.twin import (
    DEFAULT_WORKLOAD,
    Setup,
    check_executor,
    cost_meta,
    cost_name,
    fitted_executor,
)

DEFAULT_LOADS = (0.5, 0.7)
DEFAULT_SLO = SLO()  # sustainable, median scheduling delay <= 2 s
VALIDATION_DIRS = ("runs", "capacity")  # beside VALIDATION_FILES in `out`


# ---- validation ------------------------------------------------------------------------------------------


def _check_inputs(policies: list[str], loads: list[float], fitted: CostModel, out: str | Path,
                  setup: Setup) -> tuple[list[str], list[float]]:
    """Every check that needs neither the device nor torch; the policies and loads, normalised."""
    from simctl.policies.registry import POLICIES
    from simctl.results.output import check_out_dir

    if isinstance(policies, str):
        policies = [p.strip() for p in policies.split(",")]
    names = list(POLICIES) if any(p == "all" for p in policies) else list(policies)
    if not names:
        raise InputError("no policy given")
    for p in names:
        if p not in POLICIES:
            raise InputError(f"unknown policy {p!r}; known policies: {', '.join(POLICIES)} (or all)")
    if len(set(names)) != len(names):
        raise InputError(f"a policy is listed twice: {', '.join(names)}")
    loads = check_loads(loads)
    for p in names:
        setup.real_config(p, 1.0).validate()
    check_fitted_run(getattr(fitted, "meta", {}), setup.device, None, setup.dtype)
    check_out_dir(Path(out), VALIDATION_FILES, VALIDATION_DIRS)
    setup.workload.at(1.0).validate()
    check_probe_requests(setup.workload.num_requests)
    return names, loads


def validate_main(policies: list[str], workload: Workload = DEFAULT_WORKLOAD,
                  loads: list[float] = DEFAULT_LOADS, cost: str | Path | CostModel | None = None,
                  out: str | Path = "out/validate", model: str = "tiny", threads: int | None = None,
                  slo: SLO = DEFAULT_SLO, capacity: bool = False,
                  quiet_wait_s: float = 0.0, repeats: int = 1, device: str = "cpu", dtype: str | None = None,
                  attention: str | None = None, prefill_instances: int | None = None,
                  decode_instances: int | None = None,
                  log: Callable[[str], None] | None = None) -> ValidationReport:
    """Validate the simulator with `cost` (a fitted cost_model.json of `device`, or a `CostModel`) against
    real runs on `device` (cpu, cuda, cuda:N; see the module docstring) of `workload` (its rate: each load's)
    and write
    validation.{csv,md,png,json} and the runs' folders into `out`. `policies` may contain "all". `threads`:
    the real runs' CPU threads [default: those the cost model was profiled with, else every core]. `dtype`:
    the real runs' [default: the one the cost model was profiled in, else float32; another is refused], and so
    is `attention` (`simctl.executor.config.ATTENTION`) [default: the cost model's, else auto]. `repeats`:
    real runs per policy and load (measured metrics are their medians; capacity probes run once). `log`
    receives one line per step. `quiet_wait_s`: before each real run, wait up to this long for a second in
    which other processes use at most 15% of the machine (a shared machine's load slows the real run, not
    the simulation); the other processes' share during each run is reported either way. InputError for bad
    input (before anything runs); RuntimeError if a real run crashed. `prefill_instances` and
    `decode_instances` (both 1): real disaggregated runs (`engine.disagg`, `threads` per instance) against the
    simulated cluster, its link as each real run measured it (`DEFAULT_LINK_GBPS` for the capacity search);
    each pool's iterations are replayed apart."""
    from simctl.common.checks import is_number

    say = log or (lambda _msg: None)
    if not (is_number(quiet_wait_s) and 0 <= quiet_wait_s < math.inf):
        raise InputError(f"--quiet-wait must be a number of seconds >= 0, got {quiet_wait_s!r}")
    check_repeats(repeats)
    fitted = load_cost(cost, get_model(model), None).cost
    fit = cost_meta(fitted)
    threads = fit["threads"] if threads is None and isinstance(fit["threads"], int) else threads
    setup = Setup(workload=workload, model=model, threads=threads,
                  dtype=dtype if dtype is not None else fitted_dtype(fit) or "float32",
                  device=str(device), attention=attention if attention is not None
                  else fitted_executor(fitted).attention, eager=fitted_executor(fitted).eager,
                  prefill_instances=prefill_instances, decode_instances=decode_instances)
    names, loads = _ready(setup, fitted, policies, loads, out)
    with SimctlEngine(setup, fitted, names, say, quiet_wait_s) as engine:  # probes the device
        t_start = time.perf_counter()
        config: dict[str, Any] = {
            "policies": names, "loads": loads, "cost": cost_name(cost), **engine.settings(),
            "slo": slo.to_dict(), "slo_text": slo.describe(),
            "capacity": capacity, "repeats": repeats, "cost_model_fit": cost_meta(fitted),
            "loadavg_start": loadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        compare = Comparisons(engine, fitted, slo, Path(out), repeats, say)
        plan = pipeline.Plan(names, loads, repeats, slo, Path(out), capacity, setup.workload,
                             (*VALIDATION_FILES, *VALIDATION_DIRS))
        outcome = pipeline.run(engine, plan, compare, say)
    config["loadavg_end"] = loadavg()
    config["wall_s"] = round(time.perf_counter() - t_start, 1)
    found = compare.found
    report = ValidationReport(config, found.rows, capacities(outcome), found.evidence, Path(out), found.pairs)
    write_report(report)
    return report


def _ready(setup: Setup, fitted: CostModel, policies: list[str], loads: list[float], out: str | Path
           ) -> tuple[list[str], list[float]]:
    """Every check before the device is probed; the policies and loads normalised."""
    from simctl.executor.runtime import default_threads

    pair = setup.real_config(policies[0] if policies else "vllm", 1.0)
    if pair.disaggregated and setup.threads is not None and 2 * setup.threads > default_threads():
        raise InputError(f"a disaggregated validation runs two instances of {setup.threads} thread(s) each "
                         f"(the cost model's) on {default_threads()} core(s): give --threads, and a cost "
                         "model profiled with that many (simctl profile --threads N)")
    names, loads = _check_inputs(policies, loads, fitted, out, setup)
    runs = setup.real_config(names[0], 1.0)
    check_executor(fitted, {"device": runs.device, "executor_config": runs.executor.record(runs.device)})
    return names, loads


def rescore(validation: str | Path, cost: str | Path, out: str | Path,
            log: Callable[[str], None] | None = None) -> ValidationReport:
    """Score another cost model against the real runs of a finished validation, without running anything
    real: the simulated capacities, every twin simulation, the replays and the report are redone with `cost`
    and written to `out` (the real runs stay in `validation`). The rates are those the real runs used (the
    loads stay relative to the original simulated capacity); capacity errors use the real capacities found
    then. Real runs are minutes of a noisy machine; this takes seconds, for iterating on a cost model."""
    from simctl.results.output import check_out_dir

    say = log or (lambda _msg: None)
    src = Path(validation)
    old = load_report(src)
    c = old.config
    fitted = load_cost(cost, get_model(c["model"]), None).cost
    out = Path(out)
    if out.resolve() == src.resolve():
        raise InputError(f"--out {out}: write the rescored report to another folder than the validation's")
    check_out_dir(out, VALIDATION_FILES, VALIDATION_DIRS)
    remove_earlier(out, say, (*VALIDATION_FILES, *VALIDATION_DIRS))
    slo = SLO.from_dict(c["slo"])
    # a validation from before executor configurations were recorded let torch pick its kernels: "any"
    setup = Setup(workload=replace(Workload.of_record(c), qps=None), model=c["model"], threads=c["threads"],
                  dtype=c["dtype"], device=c.get("device", "cpu"),
                  kv_budget_bytes=c.get("kv_budget_bytes"), attention=c.get("attention", "any"),
                  eager=c.get("eager", True))
    check_fitted_run(getattr(fitted, "meta", {}), setup.device, c.get("device_name"), setup.dtype)
    caps: dict[str, dict[str, Any]] = {}
    twins = SimctlEngine(setup, fitted, list(old.capacity))  # its twins only: nothing real runs
    var = pipeline.variable_of(setup.workload)  # closed-loop clients without a rate: the concurrency
    for policy, was in old.capacity.items():
        lo, hi = bracket(pipeline.twin_capacity(twins, policy, slo, setup.workload))
        real = was.get(f"real_{var}")
        caps[policy] = {**{k: v for k, v in was.items() if k.startswith("real")},
                        f"sim_{var}": lo, f"sim_fail_{var}": hi, f"original_sim_{var}": was[f"sim_{var}"],
                        "error_pct": pct_error(lo, real) if real else None}
        say(f"{policy}: simulated capacity {pipeline.describe(var, lo)} (was {was[f'sim_{var}']:.4g})")
    found = Findings()
    for r in old.rows:
        reals = real_dirs(src / "runs" / r["policy"] / f"load_{r['load']:g}", c.get("repeats", 1))
        run_dir = out / "runs" / r["policy"] / f"load_{r['load']:g}"
        found.add(compare_run(r["policy"], r["load"], r[var], caps[r["policy"]][f"sim_{var}"], reals, run_dir,
                              fitted, slo, r.get("foreign_cpu_share"), var))
    config = {**c, "cost": cost_name(cost), "rescored_from": str(src), "original_cost": c["cost"],
              "cost_model_fit": cost_meta(fitted)}
    report = ValidationReport(config, found.rows, caps, found.evidence, out, found.pairs)
    write_report(report)
    return report
