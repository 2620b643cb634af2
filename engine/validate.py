"""`simctl validate`: check the simulator against real execution on this machine.

    report = validate_main(["sarathi", "vllm"], "sharegpt", [0.5, 0.7], cost="cost_model.json", out="out/val")

For each policy:

1. **Simulated capacity on the twin setup.** The highest QPS whose *simulated* run meets the SLO (default:
   sustainable and median scheduling delay <= 2 s; optionally P99 TBT), by bisection over QPS. Every probe
   is the run a real run at that rate would be: the same request generator (`traces.build_trace`:
   trace, count, seed, scaled lengths), the same KV sizing (`engine.real.size_run` with the CPU slab budget),
   the policy rebuilt by `engine.real.twin_inputs`, priced by the fitted cost model.
2. **Loads.** For each load (a fraction of that capacity) `repeats` real runs (`engine.real.real_main`, a
   child process each) and the simulator on the identical requests (`twin_inputs(summary)`): signed errors
   (sim - real) / real of P50/P90/P99 TTFT, TBT and E2E and of throughput (requests/s, output tokens/s), the
   measured value of each metric being its median over the repeats (their min and max are kept: the
   run-to-run spread). Repeats run in rounds (every policy and load once per round), so a slow spell of a
   shared machine lands on one repeat of several points rather than on every repeat of one: on this
   project's 2-core VM the same run's decode steps took 2.1 ms in one run and 3.0 ms a minute later.
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

CPU only (the real run's KV sizing on cuda depends on the free device memory at run time).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from common.errors import InputError
from sim.capacity import SLO, CapacityResult, search_qps
from sim.cost.base import ScaledCost

DEFAULT_TRACE = "sharegpt"
DEFAULT_SCALE = 0.05  # sharegpt x 0.05: median prompt ~80 tokens, output ~20; a real run takes ~10-30 s here
DEFAULT_NUM_REQUESTS = 300  # see the module docstring: fewer, and the default SLO never binds
DEFAULT_LOADS = (0.5, 0.7)
DEFAULT_SLO = SLO()  # sustainable, median scheduling delay <= 2 s
MAX_LOAD = 10.0
SIM_REL_TOL = 0.01  # the simulated capacity's bisection (cheap: milliseconds per probe)
SIM_MAX_PROBES = 40
REAL_REL_TOL = 0.03
REAL_STEP = 1.25  # real capacity: bracket by this factor around the simulated capacity...
MAX_REAL_PROBES = 6  # ...with at most this many real runs per policy
MAX_REPEATS = 20
METRICS = ("ttft_p50", "ttft_p90", "ttft_p99", "tbt_p50", "tbt_p90", "tbt_p99", "e2e_p50", "e2e_p90", "e2e_p99",
           "throughput_rps", "throughput_tokens_per_s")
LABELS = {"ttft": "TTFT", "tbt": "TBT", "e2e": "E2E", "throughput_rps": "req/s",
          "throughput_tokens_per_s": "out tok/s"}


def metric_label(m: str) -> str:
    if m in LABELS:
        return LABELS[m]
    base, p = m.rsplit("_", 1)
    return f"{p.upper()} {LABELS[base]}"


# ---- bisection over QPS (one search, any probe) ----------------------------------------------------------------


def bracket(result: CapacityResult) -> tuple[float, float | None]:
    """(highest rate that met the SLO, lowest rate above it that did not; None if none was probed)."""
    above = [p["qps"] for p in result.probes if not p["slo_met"] and p["qps"] > result.qps]
    return result.qps, (min(above) if above else None)


# ---- the twin setup ----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Setup:
    """What every run of one validation shares (the real runs' options)."""

    trace: str = DEFAULT_TRACE
    model: str = "tiny"
    num_requests: int = DEFAULT_NUM_REQUESTS
    scale: float = DEFAULT_SCALE
    seed: int = 0
    threads: int | None = None
    dtype: str = "float32"

    def real_config(self, policy: str, qps: float) -> Any:
        from engine.real import RealConfig

        return RealConfig(policy=policy, trace=self.trace, model=self.model, device="cpu", qps=qps,
                          num_requests=self.num_requests, scale=self.scale, seed=self.seed, dtype=self.dtype,
                          threads=self.threads)


def real_dirs(run_dir: Path, repeats: int) -> list[Path]:
    """Where the real runs of one policy and load go: `real/`, then `real_2/`, `real_3/`, ..."""
    return [run_dir / "real"] + [run_dir / f"real_{k}" for k in range(2, repeats + 1)]


def twin_summary(setup: Setup, policy: str, qps: float) -> dict[str, Any]:
    """The summary fields `engine.real.twin_inputs` reads, as a real CPU run of `policy` at `qps` would
    record them (its requests and its KV sizing), without running it."""
    from engine.real import CPU_KV_BYTES, size_run, sized_policy
    from sim.cost.fitted import dtype_bytes_of
    from sim.models import get_model
    from traces import build_trace

    config = setup.real_config(policy, qps)
    requests = build_trace(config.trace, config.num_requests, qps, config.seed, arrival=config.arrival,
                           cv=config.cv, scale=config.scale)
    spec = get_model(config.model)
    size = size_run(config, requests, spec.kv_bytes_per_token(dtype_bytes_of(config.dtype)), CPU_KV_BYTES)
    probe = sized_policy(config, size)
    return {**asdict(config), "kv_capacity_tokens": size.kv_capacity, "max_seq_len": size.max_seq_len,
            **probe.settings.as_dict()}


def simulate_twin(summary: dict[str, Any], cost: Any) -> tuple[dict[str, Any], Any]:
    """The simulator's prediction of the run `summary` describes (a real run's, or `twin_summary`'s):
    (its summary, its SimResult)."""
    from engine.real import twin_inputs
    from sim.metrics import summarize
    from sim.simulate import simulate

    requests, policy = twin_inputs(summary)
    result = simulate(requests, policy, cost, max_waiting=max(1000, len(requests) // 2))
    keep = ("policy", "trace", "model", "qps", "scale", "seed", "arrival", "cv", "max_seq_len")
    s = {"mode": "sim", **{k: summary.get(k) for k in keep}, **policy.settings.as_dict(), **summarize(result)}
    return s, result


# ---- replaying a real run's iterations ---------------------------------------------------------------------


@dataclass
class Replay:
    frame: pd.DataFrame  # one row per replayed iteration: measured and predicted duration, shape, terms
    gaps: Any  # serving.records.GapHistogram of the real run's token gaps (from the real times)
    matched: int  # iterations whose replayed plan matched the logged one
    total: int  # iterations logged
    between_s: float  # measured time between iterations while work was pending (sampling, bookkeeping)
    between_n: int


def _kind(plan: Any) -> str:
    from policies.plan import Layout

    if plan.layout is Layout.PADDED:
        return "padded_prefill" if plan.prefill_q else "padded_decode"
    if not plan.prefill_q:
        return "decode"
    return "hybrid" if plan.decode_rows else "prefill"


def replay_real(summary: dict[str, Any], iterations: pd.DataFrame, cost: Any) -> Replay:
    """Re-plan the real run's iterations and price each plan (see the module docstring, point 4)."""
    from engine.real import twin_inputs
    from policies.plan import Layout
    from policies.seq import Seq
    from serving.inbox import Inbox
    from serving.loop import Replica
    from serving.replay import LoggedRun

    requests, policy = twin_inputs(summary)
    rows: list[dict[str, Any]] = []

    def price(plan: Any, start: float, real_s: float) -> None:
        terms = cost.breakdown(plan) if hasattr(cost, "breakdown") else {}
        ctx = [q.computed + 1 for q in plan.seqs[:plan.decode_tokens]] if plan.layout is Layout.PACKED else []
        rows.append({"start_s": start, "real_s": real_s, "predicted_s": cost.iteration_time(plan),
                     "kind": _kind(plan), "batch_size": len(plan.seqs), "linear_tokens": plan.linear_tokens,
                     "sampled_tokens": plan.sampled_tokens, "prefill_tokens": plan.prefill_tokens,
                     "decode_tokens": plan.decode_tokens, "decode_rows": plan.decode_rows,
                     "segments": len(plan.prefill_q),
                     "decode_kv": plan.decode_kv, "decode_ctx_min": min(ctx, default=0),
                     "decode_ctx_max": max(ctx, default=0), **{f"term_{k}_s": v for k, v in terms.items()}})

    log = LoggedRun(iterations, price)
    inbox = Inbox([Seq(r.id, r.arrival_s, r.prompt_tokens, r.output_tokens) for r in requests])
    replica = Replica(policy, log, log, inbox)
    log.watch(policy, inbox)
    log.drive(replica.serve())
    return Replay(pd.DataFrame(rows), replica.records.gaps, log.matched, len(iterations), log.between_s,
                  log.between_n)


def merge_replays(reps: list[Replay]) -> Replay:
    """The replays of several repeats of one run as one (frames stacked with a `repeat` column, gaps pooled)."""
    from serving.records import GapHistogram

    gaps = GapHistogram()
    for r in reps:
        gaps.counts += r.gaps.counts
        gaps.total += r.gaps.total
    frame = pd.concat([r.frame.assign(repeat=k) for k, r in enumerate(reps, 1)], ignore_index=True)
    return Replay(frame, gaps, sum(r.matched for r in reps), sum(r.total for r in reps),
                  sum(r.between_s for r in reps), sum(r.between_n for r in reps))


def iteration_evidence(rep: Replay, forward_s: float | None, sim_iterations: pd.DataFrame, repeats: int = 1
                       ) -> dict[str, Any]:
    """Busy-time totals (per real run: the mean over `repeats` pooled in `rep`) and per-kind ratios, measured /
    predicted, from a replay. `forward_s`: the real runs' total forward time, if known."""
    f = rep.frame
    real_busy = float(f["real_s"].sum()) / repeats if len(f) else 0.0
    pred_busy = float(f["predicted_s"].sum()) / repeats if len(f) else 0.0
    sim_busy = float(sim_iterations["duration_s"].sum())
    out: dict[str, Any] = {
        "repeats": repeats,
        "iterations": rep.total,
        "replay_matched": rep.matched,
        "real_busy_s": real_busy,
        "repriced_busy_s": pred_busy,  # the cost model over the real run's own plans
        "sim_busy_s": sim_busy,  # the twin simulation's own iterations
        "busy_ratio_real_over_repriced": real_busy / pred_busy if pred_busy > 0 else None,
        "busy_ratio_real_over_sim": real_busy / sim_busy if sim_busy > 0 else None,
        "real_forward_s": None if forward_s is None else forward_s / repeats,  # inside the iterations: forward
        "real_in_iteration_overhead_s": (real_busy - forward_s / repeats
                                         if forward_s is not None and rep.matched == rep.total
                                         else None),  # drain arrivals + schedule + inputs, per iteration
        "real_between_s": rep.between_s / repeats,  # argmax + bookkeeping between back-to-back iterations
        "real_between_mean_s": rep.between_s / rep.between_n if rep.between_n else None,
        "sim_iterations": int(sim_iterations["count"].sum()),
        "kinds": {},
    }
    if len(f):
        ratio = f["real_s"] / f["predicted_s"]
        for kind, g in f.groupby("kind"):
            out["kinds"][kind] = _ratios(g, ratio[g.index])
        dec = f[(f["kind"] == "decode") & (f["decode_tokens"] >= 2)]
        if len(dec):  # the profile timed decode batches of equal contexts only
            ragged = dec["decode_ctx_min"] < dec["decode_ctx_max"]
            out["decode_uniform_ctx"] = _ratios(dec[~ragged], ratio[dec[~ragged].index]) if (~ragged).any() else None
            out["decode_ragged_ctx"] = _ratios(dec[ragged], ratio[dec[ragged].index]) if ragged.any() else None
        out["decode_excess"] = _excess(f[f["kind"].isin(["decode", "padded_decode"])],
                                       {"per_row_ms": f["decode_rows"]})
        out["prefill_excess"] = _excess(f[f["prefill_tokens"] > 0],
                                        {"per_100_prefill_ms": f["prefill_tokens"] / 100})
    return out


def _ratios(g: pd.DataFrame, r: pd.Series) -> dict[str, Any]:
    return {"n": len(g), "real_s": float(g["real_s"].sum()), "predicted_s": float(g["predicted_s"].sum()),
            "ratio_total": float(g["real_s"].sum() / g["predicted_s"].sum()), "ratio_p50": float(r.median()),
            "real_p50_s": float(g["real_s"].median()), "predicted_p50_s": float(g["predicted_s"].median())}


def _excess(g: pd.DataFrame, features: dict[str, pd.Series]) -> dict[str, Any] | None:
    """Least squares of (measured - predicted) in ms on a constant and `features` over the rows of `g`: what
    the cost model misses per unit of each (None with fewer than 10 rows or no spread)."""
    if len(g) < 10:
        return None
    X = np.column_stack([np.ones(len(g))] + [v[g.index].to_numpy(dtype=float) for v in features.values()])
    if np.linalg.matrix_rank(X) < X.shape[1]:
        return None
    y = (g["real_s"] - g["predicted_s"]).to_numpy() * 1e3
    coef, *_ = np.linalg.lstsq(X, y, rcond=None)
    return {"n": len(g), "const_ms": float(coef[0]), **{k: float(c) for k, c in zip(features, coef[1:])}}


# ---- machine load while a real run ran -----------------------------------------------------------------------


class LoadMeter:
    """Other processes' share of the machine's CPU between `start()` and `stop()` (Linux /proc/stat; None
    elsewhere): machine busy time minus this process's and its waited-for children's (the serving child)."""

    def __init__(self) -> None:
        import os

        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cpus = os.cpu_count() or 1
        self.t0: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, float, float] | None:
        import os

        try:
            with open("/proc/stat", encoding="ascii") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / self.hz, own, time.perf_counter()

    def start(self) -> None:
        self.t0 = self._read()

    def stop(self) -> float | None:
        t1 = self._read()
        if self.t0 is None or t1 is None or t1[2] <= self.t0[2]:
            return None
        foreign = (t1[0] - self.t0[0]) - (t1[1] - self.t0[1])
        return max(0.0, foreign) / (self.cpus * (t1[2] - self.t0[2]))


def wait_quiet(max_wait_s: float, share: float = 0.15, window_s: float = 1.0) -> tuple[float, float | None]:
    """Wait, up to `max_wait_s`, for a `window_s` window in which other processes use at most `share` of the
    machine; returns (seconds waited, their share in the last window)."""
    meter, waited, last = LoadMeter(), 0.0, None
    while waited < max_wait_s:
        meter.start()
        time.sleep(window_s)
        last = meter.stop()
        waited += window_s
        if last is None or last <= share:
            break
    return waited, last


def _loadavg() -> list[float] | None:
    import os

    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None


# ---- validation ------------------------------------------------------------------------------------------


def pct_error(predicted: Any, measured: Any) -> float | None:
    """(predicted - measured) / measured in percent; None when undefined."""
    if predicted is None or measured is None or not math.isfinite(predicted) or not math.isfinite(measured):
        return None
    if measured == 0:
        return None
    return 100.0 * (predicted - measured) / measured


@dataclass
class RunPair:
    """One real run at one load and its simulated twin, in memory (for the figure)."""

    policy: str
    load: float
    real_ttft: np.ndarray
    sim_ttft: np.ndarray
    real_gaps: Any  # GapHistogram (replayed from the real times)
    sim_gaps: Any
    replay_complete: bool


@dataclass
class ValidationReport:
    config: dict[str, Any]  # options, cost model, SLO, machine load, timing
    rows: list[dict[str, Any]]  # one per policy and load: real, predicted and % error of each metric
    capacity: dict[str, dict[str, Any]]  # policy -> simulated (and real) capacity, probes
    evidence: list[dict[str, Any]]  # one per policy and load: per-iteration measured vs predicted
    out: Path
    pairs: list[RunPair] = field(default_factory=list, repr=False)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows)

    def to_json(self) -> dict[str, Any]:
        return {"config": self.config, "rows": self.rows, "capacity": self.capacity, "evidence": self.evidence}

    def error(self, policy: str, load: float, metric: str) -> float | None:
        for r in self.rows:
            if r["policy"] == policy and r["load"] == load:
                return r[f"{metric}_err_pct"]
        raise KeyError((policy, load))


def load_cost(cost: Any, model: str) -> Any:
    """The cost model to validate: a fitted cost_model.json (checked against `model`), or a `CostModel`
    object as is (programmatic use, tests)."""
    from sim.cost.base import CostModel
    from sim.cost.fitted import Fitted
    from sim.models import get_model

    if isinstance(cost, CostModel):
        fitted = cost
    else:
        if cost is None or not str(cost).strip():
            raise InputError("--cost: give the fitted cost model (cost_model.json) of this machine")
        fitted = Fitted.load(cost)
    if hasattr(fitted, "check_model"):
        fitted.check_model(get_model(model))
    return fitted


def _cost_name(cost: Any) -> str:
    from sim.cost.base import CostModel

    return repr(cost) if isinstance(cost, CostModel) else str(cost)


def _cost_meta(cost: Any) -> dict[str, Any]:
    meta = getattr(cost, "meta", None) or {}
    return {k: meta.get(k) for k in ("device_name", "threads", "date", "grid")}


def _check_inputs(policies: list[str], loads: list[float], cost: str | Path, out: str | Path, setup: Setup,
                  slo: SLO) -> tuple[list[str], list[float], Any]:
    from common.checks import is_number
    from policies.registry import POLICIES
    from sim.output import check_out_dir

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
    if isinstance(loads, (int, float)):
        loads = [loads]
    loads = list(loads)
    if not loads:
        raise InputError("no load given (fractions of the simulated capacity, e.g. 0.5,0.7)")
    for v in loads:
        if not is_number(v) or not (0 < v <= MAX_LOAD and math.isfinite(v)):
            raise InputError(f"--loads: each load must be a number in (0, {MAX_LOAD:g}] (a fraction of the "
                             f"simulated capacity), got {v!r}")
    if len(set(loads)) != len(loads):
        raise InputError(f"a load is listed twice: {', '.join(f'{v:g}' for v in loads)}")
    loads = [float(v) for v in loads]
    slo.validate()
    fitted = load_cost(cost, setup.model)
    device = str(getattr(fitted, "meta", {}).get("device", "cpu")).lower()
    if device != "cpu":
        raise InputError(f"the cost model {cost} was profiled on {device!r}; validation runs the model on this "
                         "machine's CPU: give a CPU profile's fit")
    for p in names:
        setup.real_config(p, 1.0).validate()
        twin_summary(setup, p, 1.0)  # sizing: every request fits the model and the KV slab
    check_out_dir(Path(out))
    return names, loads, fitted


def _frames_identical(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    cols = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    if len(a) != len(b):
        return False
    a = a.sort_values("request_id")[cols].reset_index(drop=True)
    b = b.sort_values("request_id")[cols].reset_index(drop=True)
    return bool(a.equals(b))


def _ttft(req: pd.DataFrame) -> np.ndarray:
    done = req[req["first_token_s"] >= 0]
    return (done["first_token_s"] - done["arrival_s"]).to_numpy()


def validate_main(policies: list[str], trace: str = DEFAULT_TRACE, loads: list[float] = DEFAULT_LOADS,
                  cost: str | Path | Any = None, out: str | Path = "out/validate", model: str = "tiny",
                  scale: float = DEFAULT_SCALE, num_requests: int = DEFAULT_NUM_REQUESTS, seed: int = 0,
                  threads: int | None = None, slo: SLO = DEFAULT_SLO, capacity: bool = False,
                  quiet_wait_s: float = 0.0, repeats: int = 1,
                  log: Callable[[str], None] | None = None) -> ValidationReport:
    """Validate the simulator with `cost` (a fitted cost_model.json of this CPU, or a `CostModel`) against real
    runs on this CPU (see the module docstring) and write
    validation.{csv,md,png,json} and the runs' folders into `out`. `policies` may contain "all". `threads`:
    the real runs' CPU threads [default: those the cost model was profiled with, else every core]. `repeats`:
    real runs per policy and load (measured metrics are their medians; capacity probes run once). `log`
    receives one line per step. `quiet_wait_s`: before each real run, wait up to this long for a second in
    which other processes use at most 15% of the machine (a shared machine's load slows the real run, not
    the simulation); the other processes' share during each run is reported either way. InputError for bad
    input (before anything runs); RuntimeError if a real run crashed."""
    from common.checks import is_number
    from engine.real import real_main
    from sim.output import prepare_out_dir

    say = log or (lambda _msg: None)
    if not (is_number(quiet_wait_s) and 0 <= quiet_wait_s < math.inf):
        raise InputError(f"--quiet-wait must be a number of seconds >= 0, got {quiet_wait_s!r}")
    if isinstance(repeats, bool) or not isinstance(repeats, int) or not 1 <= repeats <= MAX_REPEATS:
        raise InputError(f"--repeats must be an integer from 1 to {MAX_REPEATS}, got {repeats!r}")
    setup = Setup(trace=trace, model=model, num_requests=num_requests, scale=scale, seed=seed, threads=threads)
    names, loads, fitted = _check_inputs(policies, loads, cost, out, setup, slo)
    profiled_threads = _cost_meta(fitted)["threads"]
    if threads is None and isinstance(profiled_threads, int):
        setup = Setup(trace=trace, model=model, num_requests=num_requests, scale=scale, seed=seed,
                      threads=profiled_threads)
    t_start = time.perf_counter()
    config: dict[str, Any] = {
        "policies": names, "loads": loads, "cost": _cost_name(cost), **asdict(setup), "device": "cpu",
        "slo": asdict(slo), "slo_text": slo.describe(), "capacity": capacity, "repeats": repeats,
        "cost_model_fit": _cost_meta(fitted),
        "loadavg_start": _loadavg(), "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    rows: list[dict[str, Any]] = []
    caps: dict[str, dict[str, Any]] = {}
    evidence: list[dict[str, Any]] = []
    pairs: list[RunPair] = []
    meter = LoadMeter()

    def real_run(**kw: Any) -> tuple[dict[str, Any], float | None]:
        if quiet_wait_s > 0:
            waited, share = wait_quiet(quiet_wait_s)
            if share is not None and share > 0.15:
                say(f"  the machine is busy ({share:.0%} of it used by other processes after {waited:.0f} s); "
                    "running anyway")
        meter.start()
        s = real_main(trace=setup.trace, model=setup.model, num_requests=setup.num_requests, scale=setup.scale,
                      seed=setup.seed, dtype=setup.dtype, threads=setup.threads, **kw)
        return s, meter.stop()

    out = Path(out)
    # 1. the simulated capacities on the twin setup (cheap; all before any real run, so an SLO that does not
    # bind fails fast)
    for policy in names:
        sim_cap = search_qps(lambda q, p=policy: simulate_twin(twin_summary(setup, p, q), fitted)[0], slo,
                             1.0, SIM_REL_TOL, SIM_MAX_PROBES)
        lo, hi = bracket(sim_cap)
        if lo <= 0:
            raise InputError(f"{policy}: no simulated rate meets the SLO ({slo.describe()}); relax it")
        if hi is None:
            raise InputError(f"{policy}: the SLO ({slo.describe()}) is met at every simulated rate up to "
                             f"{lo:.3g} QPS: {setup.num_requests} requests are served before a queue builds; "
                             "raise --num-requests (or tighten the SLO)")
        caps[policy] = {"sim_qps": lo, "sim_fail_qps": hi, "sim_probes": [
            {k: p[k] for k in ("qps", "slo_met", "sched_delay_p50", "tbt_p99", "ttft_p50", "sustainable",
                               "completed", "throughput_rps")} for p in sim_cap.probes]}
        say(f"{policy}: simulated capacity {lo:.4g} QPS ({len(sim_cap.probes)} simulated probes)")

    prepare_out_dir(out)
    # 2. real runs at each load, in rounds (every policy and load once per round), then their twins
    points = [(policy, load, load * caps[policy]["sim_qps"]) for policy in names for load in loads]
    foreign_shares: dict[tuple[str, float], list[float]] = {}
    for k in range(repeats):
        for policy, load, qps in points:
            run_dir = out / "runs" / policy / f"load_{load:g}"
            say(f"{policy}: real run at load {load:g} ({qps:.4g} QPS, {setup.num_requests} requests)"
                + (f", repeat {k + 1} of {repeats}" if repeats > 1 else ""))
            _, share = real_run(policy=policy, qps=qps, out=real_dirs(run_dir, repeats)[k])
            if share is not None:
                foreign_shares.setdefault((policy, load), []).append(share)
    for policy, load, qps in points:
        run_dir = out / "runs" / policy / f"load_{load:g}"
        shares = foreign_shares.get((policy, load))
        row, ev, pair = compare_run(policy, load, qps, caps[policy]["sim_qps"], real_dirs(run_dir, repeats),
                                    run_dir, fitted, slo, max(shares) if shares else None)
        rows.append(row)
        evidence.append(ev)
        pairs.append(pair)
        say(f"{policy} @ {load:g}: P50 TTFT {_fmt_err(row['ttft_p50_err_pct'])}, P50 TBT "
            f"{_fmt_err(row['tbt_p50_err_pct'])}, P50 E2E {_fmt_err(row['e2e_p50_err_pct'])}; busy real/"
            f"repriced {_fmt_ratio(ev['busy_ratio_real_over_repriced'])}")

    for policy in names:
        lo = caps[policy]["sim_qps"]
        # 4. the real capacity, a few real runs from the simulated one
        if capacity:
            def probe(q: float, p: str = policy) -> dict[str, Any]:
                s, foreign = real_run(policy=p, qps=q, out=out / "capacity" / p / f"qps_{q:.5g}")
                s["foreign_cpu_share"] = foreign
                say(f"{p}: real capacity probe at {q:.4g} QPS: SLO {'met' if slo.met(s) else 'missed'} "
                    f"(median scheduling delay {s['sched_delay_p50']:.3g} s, other CPU "
                    f"{'n/a' if foreign is None else f'{foreign:.0%}'})")
                return s

            # start at the simulated capacity, unless a real run at a load already missed the SLO: then at
            # the highest load rate that met it (the real capacity is above it and below the miss)
            runs = [r for r in rows if r["policy"] == policy]
            start = lo
            if not all(r["real_slo_met"] for r in runs):
                met = [r["qps"] for r in runs if r["real_slo_met"]]
                start = max(met) if met else min(r["qps"] for r in runs) / REAL_STEP
            real_cap = search_qps(probe, slo, start, REAL_REL_TOL, MAX_REAL_PROBES, REAL_STEP)
            rlo, rhi = bracket(real_cap)
            caps[policy].update({
                "real_qps": rlo, "real_fail_qps": rhi,
                "error_pct": pct_error(lo, rlo) if rlo > 0 else None,
                "real_probes": [{k: p.get(k) for k in ("qps", "slo_met", "sched_delay_p50", "tbt_p99", "ttft_p50",
                                                       "sustainable", "completed", "throughput_rps",
                                                       "foreign_cpu_share")}
                                for p in real_cap.probes]})
            say(f"{policy}: real capacity {rlo:.4g} QPS (first failing {rhi if rhi is None else f'{rhi:.4g}'}), "
                f"capacity error {_fmt_err(caps[policy]['error_pct'])}")

    config["loadavg_end"] = _loadavg()
    config["wall_s"] = round(time.perf_counter() - t_start, 1)
    report = ValidationReport(config, rows, caps, evidence, out, pairs)
    write_report(report)
    return report


def compare_run(policy: str, load: float, qps: float, sim_capacity: float, reals: list[Path], run_dir: Path,
                cost: Any, slo: SLO, foreign: float | None = None) -> tuple[dict[str, Any], dict[str, Any], RunPair]:
    """Finished real runs (their folders `reals`: repeats of one run) against the simulator on identical
    requests: writes `run_dir/sim/` and `run_dir/replay.parquet`; returns (report row, per-iteration evidence,
    CDF data). A measured metric is the median over the repeats."""
    import json

    from sim.output import atomic_write, write_run

    summaries = [json.loads((d / "summary.json").read_text(encoding="utf-8")) for d in reals]
    sim, result = simulate_twin(summaries[0], cost)
    sim_its = result.iterations.frame()
    write_run(run_dir / "sim", sim, result.requests, sim_its)
    real_reqs = [pd.read_parquet(d / "requests.parquet") for d in reals]
    reps, tbt_matches = [], []
    for d, real in zip(reals, summaries):
        rep = replay_real(real, pd.read_parquet(d / "iterations.parquet"), cost)
        tbt_matches.append(rep.matched == rep.total and all(
            v is not None and real[k] is not None and math.isclose(v, real[k], rel_tol=1e-9)
            for v, k in zip(rep.gaps.percentiles((50, 99)), ("tbt_p50", "tbt_p99"))))
        reps.append(rep)
    rep = merge_replays(reps)
    atomic_write(run_dir / "replay.parquet", lambda p: rep.frame.to_parquet(p, index=False))
    forward = [s.get("forward_s_total") for s in summaries]
    ev = iteration_evidence(rep, None if None in forward else float(sum(forward)), sim_its, len(reals))
    ev["replay_tbt_matches"] = all(tbt_matches)
    row: dict[str, Any] = {"policy": policy, "load": load, "qps": qps, "sim_capacity_qps": sim_capacity,
                           "repeats": len(reals)}
    for m in METRICS:
        measured = [s.get(m) for s in summaries]
        known = [v for v in measured if v is not None and math.isfinite(v)]
        row[f"{m}_real"] = float(np.median(known)) if len(known) == len(measured) else None
        row[f"{m}_real_min"] = min(known) if known else None
        row[f"{m}_real_max"] = max(known) if known else None
        row[f"{m}_sim"] = sim.get(m)
        row[f"{m}_err_pct"] = pct_error(sim.get(m), row[f"{m}_real"])
    # the same simulation on a machine as fast as the real runs were (their measured / repriced busy time):
    # what remains is the scheduling and queueing model's error, not the machine's drift since the profile
    speed = ev["busy_ratio_real_over_repriced"]
    adjusted = simulate_twin(summaries[0], ScaledCost(cost, speed))[0] if speed else {}
    for m in METRICS:
        row[f"{m}_adj_err_pct"] = pct_error(adjusted.get(m), row[f"{m}_real"])
    row.update({
        "identical_requests": all(_frames_identical(r, result.requests) for r in real_reqs),
        "real_completed": min(s["completed"] for s in summaries), "sim_completed": sim["completed"],
        "real_sustainable": all(s["sustainable"] for s in summaries), "sim_sustainable": sim["sustainable"],
        "real_slo_met": 2 * sum(slo.met(s) for s in summaries) > len(summaries),  # by most repeats
        "sim_slo_met": slo.met(sim),
        "real_iterations": float(np.median([s["iterations"] for s in summaries])), "sim_iterations": sim["iterations"],
        "busy_ratio_real_over_repriced": ev["busy_ratio_real_over_repriced"],
        "busy_ratio_real_over_sim": ev["busy_ratio_real_over_sim"],
        "real_between_mean_ms": (ev["real_between_mean_s"] * 1e3 if ev["real_between_mean_s"] is not None
                                 else None),
        "replay_matched": f"{rep.matched}/{rep.total}",
        "foreign_cpu_share": foreign,
        "real_wall_s": float(np.median([s.get("real_wall_s") or 0.0 for s in summaries])),
    })
    pair = RunPair(policy, load, np.concatenate([_ttft(r) for r in real_reqs]), _ttft(result.requests), rep.gaps,
                   result.gaps, rep.matched == rep.total)
    return row, {"policy": policy, "load": load, **ev}, pair


def write_report(report: ValidationReport) -> None:
    """validation.csv, validation.md, validation.png and validation.json into `report.out`."""
    from sim.output import atomic_write, json_text

    out = report.out
    frame = report.frame()
    atomic_write(out / "validation.csv", lambda p: frame.to_csv(p, index=False))
    md = markdown(report)
    atomic_write(out / "validation.md", lambda p: p.write_text(md, encoding="utf-8"))
    cdf_figure(report, out / "validation.png")
    text = json_text(jsonable(report.to_json()))
    atomic_write(out / "validation.json", lambda p: p.write_text(text, encoding="utf-8"))


def rescore(validation: str | Path, cost: str | Path, out: str | Path,
            log: Callable[[str], None] | None = None) -> ValidationReport:
    """Score another cost model against the real runs of a finished validation, without running anything
    real: the simulated capacities, every twin simulation, the replays and the report are redone with `cost`
    and written to `out` (the real runs stay in `validation`). The rates are those the real runs used (the
    loads stay relative to the original simulated capacity); capacity errors use the real capacities found
    then. Real runs are minutes of a noisy machine; this takes seconds, for iterating on a cost model."""
    from sim.output import prepare_out_dir

    say = log or (lambda _msg: None)
    src = Path(validation)
    old = load_report(src)
    c = old.config
    fitted = load_cost(cost, c["model"])
    out = Path(out)
    if out.resolve() == src.resolve():
        raise InputError(f"--out {out}: write the rescored report to another folder than the validation's")
    prepare_out_dir(out)
    slo = SLO(**c["slo"])
    setup = Setup(trace=c["trace"], model=c["model"], num_requests=c["num_requests"], scale=c["scale"],
                  seed=c["seed"], threads=c["threads"], dtype=c["dtype"])
    caps: dict[str, dict[str, Any]] = {}
    for policy, was in old.capacity.items():
        sim_cap = search_qps(lambda q, p=policy: simulate_twin(twin_summary(setup, p, q), fitted)[0], slo,
                             1.0, SIM_REL_TOL, SIM_MAX_PROBES)
        lo, hi = bracket(sim_cap)
        caps[policy] = {**{k: v for k, v in was.items() if k.startswith("real")},
                        "sim_qps": lo, "sim_fail_qps": hi, "original_sim_qps": was["sim_qps"],
                        "error_pct": pct_error(lo, was.get("real_qps")) if was.get("real_qps") else None}
        say(f"{policy}: simulated capacity {lo:.4g} QPS (was {was['sim_qps']:.4g})")
    rows, evidence, pairs = [], [], []
    for r in old.rows:
        reals = real_dirs(src / "runs" / r["policy"] / f"load_{r['load']:g}", c.get("repeats", 1))
        run_dir = out / "runs" / r["policy"] / f"load_{r['load']:g}"
        row, ev, pair = compare_run(r["policy"], r["load"], r["qps"], caps[r["policy"]]["sim_qps"], reals,
                                    run_dir, fitted, slo, r.get("foreign_cpu_share"))
        rows.append(row)
        evidence.append(ev)
        pairs.append(pair)
    config = {**c, "cost": _cost_name(cost), "rescored_from": str(src), "original_cost": c["cost"],
              "cost_model_fit": _cost_meta(fitted)}
    report = ValidationReport(config, rows, caps, evidence, out, pairs)
    write_report(report)
    return report


def load_report(out: str | Path) -> ValidationReport:
    """A finished validation's report from its validation.json (without the CDF data)."""
    import json

    path = Path(out) / "validation.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise InputError(f"{path}: not a finished validation ({e})") from None
    return ValidationReport(data["config"], data["rows"], data["capacity"], data["evidence"], Path(out))


def jsonable(v: Any) -> Any:
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.bool_):
        return bool(v)
    return v


# ---- report text ---------------------------------------------------------------------------------------------


def _fmt_err(v: float | None) -> str:
    return "n/a" if v is None else f"{v:+.1f}%"


def _fmt_ratio(v: float | None) -> str:
    return "n/a" if v is None else f"{v:.3f}"


def _fmt_value(metric: str, v: float | None) -> str:
    if v is None:
        return "n/a"
    if metric.startswith("throughput"):
        return f"{v:.3g}"
    return f"{v * 1e3:.3g}" if v < 10 else f"{v:.3g} s"


def markdown(report: ValidationReport) -> str:
    c = report.config
    lines = [
        "# Simulator validation against real execution",
        "",
        (f"{c['model']} on this CPU ({c['threads'] or 'all'} thread(s), {c['dtype']}), trace {c['trace']} x "
         f"{c['scale']:g} (lengths), {c['num_requests']} requests, seed {c['seed']}; cost model `{c['cost']}`."),
        (f"Capacity SLO: {c['slo_text']}. Loads are fractions of the simulated capacity. Errors are "
         "(predicted - measured) / measured"
         + (f"; measured values are medians of {c['repeats']} real runs (spread below)." if c.get("repeats", 1) > 1
            else ".")),
        (f"Load average {c['loadavg_start']} at the start, {c.get('loadavg_end')} at the end; "
         f"{c.get('wall_s')} s in all; {c['date']}."),
        "",
        "## Capacity (QPS)",
        "",
    ]
    real_cap = any("real_qps" in v for v in report.capacity.values())
    head = ["policy", "simulated"] + (["real", "real: first failing", "error", "real probes"] if real_cap else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for p, v in report.capacity.items():
        cells = [p, f"{v['sim_qps']:.4g}"]
        if real_cap:
            fail = v.get("real_fail_qps")
            cells += [f"{v.get('real_qps', 0):.4g}", "none" if fail is None else f"{fail:.4g}",
                      _fmt_err(v.get("error_pct")), str(len(v.get("real_probes", [])))]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Latency and throughput: measured / predicted (error)", "",
              "Latencies in ms; throughput in requests/s and output tokens/s.", ""]
    head = ["policy", "load", "QPS"] + [metric_label(m) for m in METRICS]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in report.rows:
        cells = [r["policy"], f"{r['load']:g}", f"{r['qps']:.3g}"]
        for m in METRICS:
            cells.append(f"{_fmt_value(m, r[f'{m}_real'])} / {_fmt_value(m, r[f'{m}_sim'])} "
                         f"({_fmt_err(r[f'{m}_err_pct'])})")
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Errors at the machine's speed during the runs", "",
              ("The twin simulated again with every iteration time multiplied by the real runs' busy time over "
               "their repriced busy time (the machine's speed then, relative to the profile; per-iteration "
               "evidence below). What remains is the error of the scheduling and queueing model and of the "
               "cost model's shape, not the machine's drift."), "",
              "| policy | load | speed factor | " + " | ".join(metric_label(m) for m in METRICS[:9]) + " |",
              "|" + "---|" * 12]
    for r in report.rows:
        lines.append(f"| {r['policy']} | {r['load']:g} | {_fmt_ratio(r['busy_ratio_real_over_repriced'])} | "
                     + " | ".join(_fmt_err(r.get(f"{m}_adj_err_pct")) for m in METRICS[:9]) + " |")
    if c.get("repeats", 1) > 1:
        spread = ("ttft_p50", "tbt_p50", "e2e_p50", "tbt_p99", "throughput_rps")
        lines += ["", f"## Run-to-run spread: min - max over {c['repeats']} real runs", "",
                  "| policy | load | " + " | ".join(metric_label(m) for m in spread) + " | P50 TBT max / min |",
                  "|" + "---|" * (len(spread) + 3)]
        for r in report.rows:
            lo, hi = r["tbt_p50_real_min"], r["tbt_p50_real_max"]
            lines.append(f"| {r['policy']} | {r['load']:g} | " + " | ".join(
                f"{_fmt_value(m, r[f'{m}_real_min'])} - {_fmt_value(m, r[f'{m}_real_max'])}" for m in spread)
                + f" | {_fmt_ratio(hi / lo if lo and hi else None)} |")
    lines += ["", "## Per-iteration evidence", "",
              ("The real run's iterations replayed through its policy and priced by the cost model (per real run: "
               "means over the repeats) "
               "(*repriced*: the same plans); *sim*: the twin simulation's own iterations. *between*: measured "
               "time between back-to-back iterations (sampling, bookkeeping), which the simulator does not "
               "model; *non-forward*: time inside the logged iterations outside the forward pass (draining "
               "arrivals, scheduling, inputs). Per kind: measured / predicted total (iterations)."),
              "",
              ("Decode excess: least squares of (measured - predicted) of decode-only iterations on a constant "
               "and the decode rows (ms per row). Other CPU: the share of the machine other processes used "
               "during the real run (it slows the real run, not the simulation)."),
              "",
              ("| policy | load | iterations real / sim | replayed | busy real s | repriced s | real / repriced "
               "| sim s | real / sim | between s (mean ms) | non-forward s | per kind | decode excess | other CPU |"),
              "|" + "---|" * 14]
    by_key = {(r["policy"], r["load"]): r for r in report.rows}
    for e in report.evidence:
        r = by_key[(e["policy"], e["load"])]
        kinds = "; ".join(f"{k} {v['ratio_total']:.2f} ({v['n']})" for k, v in sorted(e["kinds"].items()))
        between = (f"{e['real_between_s']:.2f} ({e['real_between_mean_s'] * 1e3:.2f})"
                   if e["real_between_mean_s"] is not None else "0")
        nonfwd = "n/a" if e["real_in_iteration_overhead_s"] is None else f"{e['real_in_iteration_overhead_s']:.2f}"
        other = "n/a" if r["foreign_cpu_share"] is None else f"{r['foreign_cpu_share']:.0%}"
        x = e.get("decode_excess")
        excess = "n/a" if x is None else f"{x['const_ms']:+.2f} ms {x['per_row_ms']:+.3f} ms/row"
        lines.append(
            f"| {e['policy']} | {e['load']:g} | {e['iterations'] / e.get('repeats', 1):.0f} / {e['sim_iterations']} | "
            f"{e['replay_matched']}/{e['iterations']} | {e['real_busy_s']:.2f} | {e['repriced_busy_s']:.2f} | "
            f"{_fmt_ratio(e['busy_ratio_real_over_repriced'])} | {e['sim_busy_s']:.2f} | "
            f"{_fmt_ratio(e['busy_ratio_real_over_sim'])} | {between} | {nonfwd} | {kinds} | {excess} | {other} |")
    bad = [r for r in report.rows if not r["identical_requests"]]
    lines += ["", "Identical requests (ids, lengths, arrivals) in every real run and its twin: "
              + ("yes" if not bad else "NO for " + ", ".join(f"{r['policy']}@{r['load']:g}" for r in bad)), ""]
    return "\n".join(lines)


# ---- figure ----------------------------------------------------------------------------------------------------


def _hist_cdf(gaps: Any) -> tuple[np.ndarray, np.ndarray]:
    """(values, cumulative fraction) of a GapHistogram (bin centres)."""
    idx = np.nonzero(gaps.counts)[0]
    if len(idx) == 0:
        return np.empty(0), np.empty(0)
    x = 10 ** (gaps.LOW_EXP + (idx + 0.5) / gaps.PER_DECADE)
    y = np.cumsum(gaps.counts[idx]) / gaps.counts[idx].sum()
    return x, y


def _ecdf(v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    v = np.sort(np.asarray(v, dtype=float))
    return v, np.arange(1, len(v) + 1) / max(len(v), 1)


def cdf_figure(report: ValidationReport, path: Path) -> None:
    """Measured (solid) and predicted (dashed) CDFs of TTFT and TBT: one row per policy, one column per
    metric and load."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    from sim.output import atomic_write

    policies = list(dict.fromkeys(p.policy for p in report.pairs))
    loads = list(dict.fromkeys(p.load for p in report.pairs))
    cols = [(m, load) for m in ("TTFT", "TBT") for load in loads]
    nr, nc = max(len(policies), 1), max(len(cols), 1)
    fig, axes = plt.subplots(nr, nc, figsize=(3.4 * nc + 0.6, 2.5 * nr + 0.9), squeeze=False,
                             constrained_layout=True)
    pairs = {(p.policy, p.load): p for p in report.pairs}
    rows = {(r["policy"], r["load"]): r for r in report.rows}
    for i, policy in enumerate(policies):
        for j, (metric, load) in enumerate(cols):
            ax = axes[i][j]
            pair = pairs.get((policy, load))
            if pair is None:
                ax.set_visible(False)
                continue
            if metric == "TTFT":
                (xr, yr), (xs, ys) = _ecdf(pair.real_ttft), _ecdf(pair.sim_ttft)
                key = "ttft_p50"
            else:
                (xr, yr), (xs, ys) = _hist_cdf(pair.real_gaps), _hist_cdf(pair.sim_gaps)
                key = "tbt_p50"
            ax.step(xr * 1e3, yr, where="post", color="C0", lw=1.6, label="measured")
            ax.step(xs * 1e3, ys, where="post", color="C3", lw=1.4, ls="--", label="predicted")
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_ylim(0, 1.02)
            ax.grid(True, which="both", alpha=0.3)
            ax.tick_params(labelsize=8)
            r = rows[(policy, load)]
            note = "" if metric == "TTFT" or pair.replay_complete else " (replay partial)"
            ax.set_title(f"{policy}: {metric} @ load {load:g} ({r['qps']:.3g} QPS)\nP50 error "
                         f"{_fmt_err(r[key + '_err_pct'])}{note}", fontsize=9)
            if i == nr - 1:
                ax.set_xlabel(f"{metric} (ms)", fontsize=9)
            if j == 0:
                ax.set_ylabel("fraction", fontsize=9)
    axes[0][0].legend(fontsize=8, loc="lower right")
    c = report.config
    fig.suptitle(f"measured (solid) vs predicted (dashed) CDFs\n{c['model']} on CPU, {c['trace']} x "
                 f"{c['scale']:g}, {c['num_requests']} requests per run", fontsize=11)
    atomic_write(path, lambda p: fig.savefig(p, dpi=100, format="png"))
    plt.close(fig)
