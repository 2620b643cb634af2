"""The `simctl` command line."""

from __future__ import annotations

import errno
import os
import signal
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.errors import InputError
from policies.registry import POLICIES
from simctl.capacity_cmd import capacity
from simctl.cluster_options import print_cluster, run_command, with_cluster_options
from simctl.display import print_summary
from simctl.options import (
    ATTENTION_HELP,
    Arrival,
    Attention,
    Cost,
    Cv,
    Ep,
    Gpus,
    MaxModelLen,
    Models,
    OnTooLong,
    Policy,
    RoutingSkew,
    Scale,
    Seed,
    Tps,
    Trace,
)
from simctl.plan_cmd import plan_cmd
from simctl.plot_cmd import plot
from simctl.policy_options import with_policy_options
from simctl.prefill_bench_cmd import prefill_bench
from simctl.query_set_cmd import query_set_cmd
from simctl.sweep_cmd import sweep
from simctl.usage_errors import error_types, fail, given_value, usage_message

DEFAULT_NUM_REQUESTS = 1000
DEFAULT_QPS = 0.5
COMMANDS = ("run", "capacity", "plan", "real", "validate", "profile", "fit", "prefill-bench", "query-set",
            "plot", "sweep", "list")


_USAGE_ERRORS, _ABORTS = error_types()

app = typer.Typer(
    help="Simulate LLM inference serving: pick a scheduler, trace, model and GPU; get TTFT, TBT, E2E, "
         "throughput and capacity before spending GPU hours.",
    no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None,
)




@app.command()
@with_policy_options(lists=True)
@with_cluster_options(slo=True)
def run(
    policy: Annotated[str, typer.Option(help=Policy.__metadata__[0].help + " A comma list compares them.")
                      ] = "sarathi",
    trace: Trace = "arxiv",
    model: Models = "mistral-7b",
    gpu: Gpus = "a100-80gb",
    tp: Tps = "1",
    routing_skew: RoutingSkew = 0.0,
    ep: Ep = 1,
    qps: Annotated[float | None, typer.Option(help="Mean arrival rate, requests per second [default: "
                                              f"{DEFAULT_QPS}; a trace file's own arrival times are "
                                              "replayed, or time-scaled to the rate given].")] = None,
    num_requests: Annotated[int | None, typer.Option(help="Requests to simulate [default: 1000 for a length "
                                                      "profile, every row of a trace file].")] = None,
    seed: Seed = 0,
    options: dict | None = None,  # the policies' settings: generated options (simctl.policy_options)
    arrival: Arrival = "poisson",
    cv: Cv = 1.0,
    scale: Scale = 1.0,
    cost: Cost = None,
    max_model_len: MaxModelLen = None,
    on_too_long: OnTooLong = "refuse",
    out: Annotated[Path | None, typer.Option(help=(
        "Folder for summary.json, requests.parquet, iterations.parquet and "
        "replicas.parquet (one row per replica)."))] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
    timeline: Annotated[int, typer.Option(help="Also record which requests the first N iterations ran "
                                          "(timeline.parquet in --out, for `simctl plot timeline`).")] = 0,
    trace_events: Annotated[Path | None, typer.Option(help="Write the iterations as a Chrome/Perfetto trace "
                                                      "(JSON trace events) to this file.")] = None,
    goodput: Annotated[list[str] | None, typer.Option(metavar="KEY:MS[,KEY:MS]", help=(
        "vLLM bench's --goodput: per-request limits in ms on ttft, tpot and e2el (e.g. ttft:500,tpot:50, or "
        "the option repeated); adds vllm_bench.request_goodput to the summary, the requests meeting all of "
        "them per second, as vLLM computes it."))] = None,
    cluster: Any = None,  # --replicas, --router, --prefill-instances, ... (simctl.cluster_options)
    slo: Any = None,  # --slo, --attainment: the SLO (simctl.cluster_options)
) -> None:
    """Simulate a deployment (one replica unless the cluster options say more) and print its latency and
    throughput summary; with comma lists, one row per combination.

    Example: simctl run --policy vllm --trace sharegpt --qps 2 --out out/vllm; compared: simctl run --policy
    sarathi --token-budget 256,512,1024 --trace sharegpt --qps 2
    """
    from dataclasses import replace

    from results.vllm_bench import parse_goodput
    from sim.run import RunConfig
    from simctl.option_grid import grid
    from simctl.run_grid_cmd import check_single_outputs, run_grid
    from traces import build_trace, has_arrival_times, is_profile

    if qps is None and (not trace.strip() or not has_arrival_times(trace)):
        qps = DEFAULT_QPS
    base = RunConfig(trace=trace, qps=qps, seed=seed, arrival=arrival, cv=cv, scale=scale, cost=cost,
                     num_requests=DEFAULT_NUM_REQUESTS if num_requests is None else num_requests,
                     routing_skew=routing_skew, ep=ep, max_model_len=max_model_len, on_too_long=on_too_long)
    combos = grid(base, policy, model, gpu, tp, options or {})
    if len(combos) > 1:
        check_single_outputs(out=out, json=as_json, timeline=timeline, trace_events=trace_events,
                             goodput=goodput)
        return run_grid(combos, cluster, slo)
    config = combos[0].config
    config.validate()
    if num_requests is None and not is_profile(trace):  # a trace file: every row
        rows = len(build_trace(trace, None, qps, seed, arrival=arrival, cv=cv))
        config = replace(config, num_requests=rows)
        config.validate()
    cluster.validate(config.policy)
    run_command(config, cluster, out, as_json, timeline, trace_events, parse_goodput(goodput), slo)


@app.command()
@with_policy_options
def real(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option(help="What serves the trace: simctl (its own engine, scheduled by "
                                        "--policy and its settings) or vllm (the installed vLLM and its own "
                                        "scheduler, which --policy vllm-v1 models: vllm-v1's settings given "
                                        "are passed to vLLM, --max-batch-size as its max_num_seqs; vLLM's "
                                        "defaults otherwise. `make vllm` installs it).")] = "simctl",
    policy: Policy = "sarathi",
    trace: Trace = "sharegpt",
    model: Annotated[str, typer.Option(help=(
        "Model shape, built with random weights (`tiny`, `tiny-2l` suit a CPU)."))] = "tiny",
    device: Annotated[str, typer.Option(help="cpu, or cuda.")] = "cpu",
    qps: Annotated[float | None, typer.Option(help="Mean arrival rate, requests per second (real time) "
                                              "[default: 1; a trace file's own arrival times are replayed, "
                                              "or time-scaled to the rate given].")] = None,
    num_requests: Annotated[int | None, typer.Option(help="Requests to serve [default: 100 for a length "
                                                      "profile, every row of a trace file].")] = None,
    scale: Annotated[float, typer.Option(help="Multiply prompt and output lengths: the default makes "
                                         "sharegpt fit the tiny model's 2,048-token context.")] = 0.05,
    seed: Seed = 0,
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads [default: every core available].")] = None,
    options: dict | None = None,  # the policies' settings: generated options (simctl.policy_options)
    kv_capacity: Annotated[int | None, typer.Option(help="KV token slots given to the policy [default: "
                                                    "enough for every request at once].")] = None,
    attention: Attention = "auto",
    arrival: Arrival = "poisson",
    cv: Cv = 1.0,
    prefill_instances: Annotated[int | None, typer.Option(help=(
        "Disaggregated serving (with --decode-instances 1): 1 prefill instance, a process with its own model "
        "and KV that only prefills, then hands each request's KV through shared memory to the decode "
        "instance; --threads is then per instance [default: half the cores]."))] = None,
    decode_instances: Annotated[int | None, typer.Option(help=(
        "Disaggregated serving (with --prefill-instances 1): 1 decode instance, which admits requests whose "
        "KV has arrived and never prefills them."))] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for summary.json, requests.parquet, "
                                             "iterations.parquet and replicas.parquet, as `simctl run` "
                                             "(--engine vllm: the first three).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Serve a trace in real time on a real model, driven by the same policy objects as the simulator.

    Timestamps are measured; the outputs have the simulator's format, so predictions can be checked.
    Example: simctl real --policy vllm --trace sharegpt --scale 0.05 --qps 4 --num-requests 50 --out out/real
    Disaggregated: simctl real --policy vllm --qps 4 --prefill-instances 1 --decode-instances 1
    --out out/real-pd
    On vLLM: simctl real --engine vllm --trace sharegpt --scale 0.05 --qps 4 --num-requests 60
    --out out/vllm-real
    (vLLM's settings as vllm-v1's, e.g. --max-batch-size 64 --enable-prefix-caching 0)
    """
    from engine.real import real_main
    from results.output import json_text

    if engine not in ("simctl", "vllm"):
        raise InputError(f"--engine {engine!r}: choose simctl or vllm")
    try:
        if engine == "vllm":
            from engine.vllm_real import engine_settings, vllm_real_main

            _check_vllm_options(ctx, policy)
            summary = vllm_real_main(trace=trace, model=model, qps=qps, num_requests=num_requests, out=out,
                                     scale=scale, seed=seed, dtype=dtype, arrival=arrival, cv=cv,
                                     settings=engine_settings(options or {}))
        else:
            summary = real_main(policy=policy, trace=trace, model=model, device=device, qps=qps,
                                num_requests=num_requests, out=out, scale=scale, seed=seed, dtype=dtype,
                                threads=threads, options=options, kv_capacity=kv_capacity,
                                attention=attention, arrival=arrival, cv=cv,
                                prefill_instances=prefill_instances, decode_instances=decode_instances)
    except RuntimeError as e:
        # the serving child (or vLLM's engine) crashed: its last words are in the message
        raise InputError(f"real execution failed: {e}") from None
    if as_json:
        sys.stdout.write(json_text(summary))
    else:
        print_summary(summary)
        if len(summary.get("replica_metrics", ())) > 1:
            print_cluster(summary)


def _check_vllm_options(ctx: typer.Context, policy: str) -> None:
    """`simctl real --engine vllm`: InputError for an option only simctl's own engine takes."""
    from engine.vllm_real import TWIN_POLICY

    if ctx.get_parameter_source("policy").name != "DEFAULT" and policy != TWIN_POLICY:
        raise InputError(f"--policy {policy}: with --engine vllm the scheduler is vLLM's own, which --policy "
                         f"{TWIN_POLICY} models (its settings are passed to vLLM)")
    for name in ("device", "threads", "kv_capacity", "attention", "prefill_instances", "decode_instances"):
        if ctx.get_parameter_source(name).name != "DEFAULT":
            raise InputError(f"--{name.replace('_', '-')} applies to --engine simctl; vLLM runs on the CPU "
                             f"with its own threads, KV cache and attention")


@app.command()
def validate(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option(help=(
        "What the real runs run on: simctl (its own engine, each --policy) or vllm (the installed vLLM, "
        "`make vllm`, against the vllm-v1 twin priced by --cost, a fit of `simctl profile --engine vllm`; "
        "loads default 0.5,0.7,0.9, 150 requests per run; out/validate-vllm)."))] = "simctl",
    policy: Annotated[str, typer.Option(help=(
        "Policies to check: `all` or a comma-separated list (with --from-vllm-bench: the one policy "
        "predicting it [default: vllm-v1])."))] = "all",
    trace: Trace = "sharegpt",
    loads: Annotated[str, typer.Option(help="Loads as fractions of each policy's simulated capacity.")
                     ] = "0.5,0.7",
    cost: Annotated[str | None, typer.Option(help="The fitted cost_model.json of --device in --dtype "
                                             "[default: the shipped CPU fit].")] = None,
    device: Annotated[str, typer.Option(help=(
        "Where the real runs run: cpu, cuda or cuda:N. A fitted cost model prices only the device it was "
        "profiled on: another is refused."))] = "cpu",
    dtype: Annotated[str | None, typer.Option(help="float32, float16 or bfloat16 [default: the dtype the "
                                              "cost model was profiled in; another is refused].")] = None,
    attention: Annotated[str | None, typer.Option(help=f"{ATTENTION_HELP} [default: the kernels the cost "
                                                  "model was profiled with; others are refused].")] = None,
    model: Annotated[str, typer.Option(help="Model shape (the one the cost model was fitted for).")] = "tiny",
    scale: Annotated[float, typer.Option(help="Multiply prompt and output lengths (CPU-sized runs).")] = 0.05,
    num_requests: Annotated[int, typer.Option(help="Requests per run.")] = 300,
    seed: Seed = 0,
    threads: Annotated[int | None, typer.Option(help="CPU threads of the real runs [default: the profile's]."
                                                )] = None,
    capacity: Annotated[bool, typer.Option(help="Also bisect the real capacity (a few more real runs).")
                        ] = False,
    repeats: Annotated[int, typer.Option(help="Real runs per policy and load; measured values are their "
                                         "medians (a shared machine's speed drifts from run to run).")] = 1,
    prefill_instances: Annotated[int | None, typer.Option(help=(
        "With --decode-instances 1: real disaggregated runs (simctl real --prefill-instances 1 "
        "--decode-instances 1, --threads per instance) against the simulated cluster."))] = None,
    decode_instances: Annotated[int | None, typer.Option(help=(
        "With --prefill-instances 1: see there."))] = None,
    from_vllm_bench: Annotated[Path | None, typer.Option(help=(
        "Instead of real runs: a result of `vllm bench serve --save-result --save-detailed`, predicted on "
        "the same requests (their lengths, sent when the bench sent them) and shown beside it under vLLM's "
        "metric names, with the errors; needs --model and --gpu; writes vllm_bench_comparison.json and .md "
        "[--out default: out/vllm-bench]."))] = None,
    gpu: Annotated[str | None, typer.Option(help=(
        "With --from-vllm-bench: the GPU the bench ran on (catalogue)."))] = None,
    tp: Annotated[int, typer.Option(help="With --from-vllm-bench: the server's tensor-parallel degree.")] = 1,
    goodput: Annotated[list[str] | None, typer.Option(metavar="KEY:MS[,KEY:MS]", help=(
        "With --from-vllm-bench: the bench's --goodput limits in ms (ttft, tpot, e2el), to compare "
        "request_goodput (the file keeps vLLM's value, not its limits)."))] = None,
    out: Annotated[Path, typer.Option(help="Folder for validation.csv, .md, .png and the runs.")
                   ] = Path("out/validate"),
) -> None:
    """Run real and simulated side by side on identical requests and report the prediction errors.

    Example: simctl validate --policy vllm,sarathi --loads 0.5,0.7 --out out/validate; on a GPU, with a fit of
    its profile: simctl validate --device cuda --cost profiles/gpu/cost_model.json --out out/validate-gpu;
    disaggregated, with a fit profiled on one thread: simctl validate --policy vllm --prefill-instances 1
    --decode-instances 1 --threads 1 --cost profiles/cpu1/cost_model.json --out out/validate-pd;
    a vLLM bench result of your own: simctl validate --from-vllm-bench result.json --model llama-3-8b
    --gpu h100 --goodput ttft:500,tpot:50 --out out/bench; the real vLLM engine against its twin:
    simctl validate --engine vllm --cost profiles/vllm-cpu/cost_model.json --repeats 3 --capacity
    """
    from catalogue.gpus import get_gpu
    from results.validation_report import markdown
    from sim.run import default_cost_path
    from simctl.vllm_bench_cmd import check_bench_options, vllm_bench_command
    from simctl.vllm_validate_cmd import check_engine_options, vllm_validate_command
    from validation.validate import validate_main

    check_engine_options(ctx, engine, policy)
    check_bench_options(ctx, from_vllm_bench)
    if from_vllm_bench is not None:
        return vllm_bench_command(ctx, from_vllm_bench, model, gpu, policy, cost, tp, goodput, out)
    try:
        fractions = [float(x) for x in loads.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--loads {loads!r}: give comma-separated numbers, e.g. 0.5,0.7") from None
    if engine == "vllm":
        if ctx.get_parameter_source("loads").name == "DEFAULT":
            fractions = [0.5, 0.7, 0.9]
        return vllm_validate_command(ctx, trace, fractions, cost, model, scale, num_requests, seed, capacity,
                                     repeats, out)
    cost_path = cost if cost is not None else default_cost_path(get_gpu("cpu"))
    if cost_path is None:
        raise InputError("no cost model: give --cost (fit one with `simctl profile` and `simctl fit`)")
    try:
        report = validate_main([p.strip() for p in policy.split(",") if p.strip()], trace=trace,
                               loads=fractions, cost=cost_path, out=out, model=model, scale=scale,
                               num_requests=num_requests, seed=seed, threads=threads, capacity=capacity,
                               repeats=repeats, device=device, dtype=dtype, attention=attention,
                               prefill_instances=prefill_instances, decode_instances=decode_instances,
                               log=lambda line: print(line, file=sys.stderr))
    except RuntimeError as e:
        raise InputError(f"a real run failed: {e}") from None
    print(markdown(report))


@app.command()
def profile(
    ctx: typer.Context,
    out: Annotated[Path, typer.Option(help="Folder for profile.csv and meta.json, e.g. profiles/my-gpu.")],
    engine: Annotated[str, typer.Option(help="Whose iterations to time: simctl (its own executor) or vllm "
                                        "(the installed vLLM's engine steps, host overhead included, on the "
                                        "CPU; `make vllm` installs it).")] = "simctl",
    model: Annotated[str, typer.Option(help="Model shape to build with random weights (Llama-style "
                                       "catalogue entries; `tiny` and `tiny-2l` suit a CPU).")] = "tiny",
    device: Annotated[str, typer.Option(help="cpu, or cuda (uses CUDA events and synchronizes).")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads [default: every core available].")] = None,
    quick: Annotated[bool, typer.Option(help="A coarse grid (about a minute on a CPU).")] = False,
    protocol: Annotated[str, typer.Option(help=(
        "served: a shape's repetitions move its cached contexts by a few tokens and its KV slab rows, as "
        "serving does, so no per-shape cache flatters it; fixed: the "
        "same shape every repetition."))] = "served",
    attention: Attention = "auto",
) -> None:
    """Time real prefill, decode, hybrid and padded iterations of a model on this device.

    The model is built from its config with random weights: nothing is downloaded. Fit the result with
    `simctl fit`. Example: simctl profile --model tiny --device cpu --out profiles/cpu
    vLLM's own steps: simctl profile --engine vllm --model tiny --device cpu --out profiles/vllm-tiny
    """
    from profiler.profile import profile as run_profile

    if engine not in ("simctl", "vllm"):
        raise InputError(f"--engine {engine!r}: choose simctl or vllm")
    try:
        if engine == "vllm":
            from profiler.vllm_profile import profile_vllm

            for name in ("threads", "protocol", "attention"):
                if ctx.get_parameter_source(name).name != "DEFAULT":
                    raise InputError(f"--{name} applies to --engine simctl; vLLM steps run with its own "
                                     f"threads and attention, each timed as served")
            if device != "cpu":
                raise InputError(f"--device {device}: the vLLM profile runs the installed CPU build "
                                 "(--device cpu)")
            path = profile_vllm(model, dtype, quick, out)
        else:
            path = run_profile(model, device, dtype, threads, quick, out, protocol=protocol,
                               attention=attention)
    except RuntimeError as e:  # the timing child crashed: its last words are in the message
        raise InputError(f"profiling failed: {e}") from None
    Console().print(escape(f"wrote {path}/profile.csv and meta.json; next: simctl fit {path}"))


@app.command()
def fit(
    ctx: typer.Context,
    profile_dir: Annotated[Path, typer.Argument(help=(
        "A folder written by `simctl profile`, or operator profiles in Vidur's layout "
        "(compute/GPU/ORG/MODEL/mlp.csv, network/)."))],
    out: Annotated[Path | None, typer.Option(help="Where to write cost_model.json (and fit.png) [default: "
                                             "the profile folder; required for operator profiles].")] = None,
    holdout: Annotated[float, typer.Option(help=(
        "Share of each kind of iteration (operator profiles: of the token counts and attention rows) held "
        "out to measure the error."))] = 0.2,
    seed: Annotated[int, typer.Option(help="Seed of the holdout split.")] = 0,
    roofline_gpu: Annotated[str | None, typer.Option(help="Also calibrate the roofline's efficiencies "
                                                     "(mfu, mbu, overhead) for this catalogue GPU.")] = None,
    model: Annotated[str | None, typer.Option(help=(
        "Operator profiles: the model (catalogue name or config.json); the profile of "
        "its layer shape is used."))] = None,
    gpu: Annotated[str | None, typer.Option(help="Operator profiles: the catalogue GPU.")] = None,
    tp: Annotated[int, typer.Option(help="Operator profiles: the tensor-parallel degree.")] = 1,
    execution: Annotated[str, typer.Option(help=(
        "Operator profiles: eager or cuda-graph, whose step overheads the fit assumes (the "
        "profiles time kernels only)."))] = "cuda-graph",
) -> None:
    """Fit a cost model to a profile and report its held-out error per kind of iteration (per operator class
    for operator profiles).

    Example: simctl fit profiles/cpu, then simctl run --gpu cpu --model tiny
    --cost profiles/cpu/cost_model.json; simctl fit ../shared/reference/gpu_profiles --model llama-2-70b
    --gpu h100 --tp 4 --out fits/h100-70b-tp4
    """
    operators = (Path(profile_dir) / "compute").is_dir()
    given = [n for n in ("model", "gpu", "tp", "execution") if ctx.get_parameter_source(n).name != "DEFAULT"]
    if operators:
        from catalogue.models import get_model
        from profiler.fit_operators import fit_operator_profile, format_operator_report

        if roofline_gpu is not None:
            raise InputError("--roofline-gpu calibrates on a simctl profile; operator profiles are fitted "
                             "as they are")
        if model is None or gpu is None:
            raise InputError(f"{profile_dir} holds operator profiles: give --model and --gpu (and --tp) "
                             "to fit")
        report = fit_operator_profile(profile_dir, get_model(model), gpu, tp, execution, out, holdout, seed)
        print(format_operator_report(report))
        return
    if given:
        raise InputError(f"--{given[0]} applies to operator profiles (a folder with compute/); "
                         f"{profile_dir} is fitted as a simctl profile")
    from profiler.fit import fit_profile
    from profiler.fit_report import format_report

    report = fit_profile(profile_dir, out=out, holdout=holdout, seed=seed, roofline_gpu=roofline_gpu)
    print(format_report(report))


app.command()(with_policy_options(capacity, lists=True))
app.command("prefill-bench")(prefill_bench)
app.command("query-set")(query_set_cmd)
app.command("plot")(plot)
app.command("sweep")(sweep)
app.command("plan")(with_policy_options(plan_cmd, lists=True))


@app.command("list")
def list_catalogue() -> None:
    """Show the policies, traces, models and GPUs simctl knows."""
    from catalogue.gpus import GPUS
    from catalogue.models import MODELS
    from costs.overheads import EXECUTION_MODES, StepOverheads
    from costs.roofline import DEFAULT_ATTN_MFU, DEFAULT_MBU, DEFAULT_MFU
    from traces import PROFILES

    console = Console()
    for title, rows in (
        ("policies", [(n, f"{c.summary}; settings: " + ", ".join(
            f"--{k.replace('_', '-')} {v if v is not None else '(derived)'}"
            for k, v in c.Settings().as_dict().items())) for n, c in POLICIES.items()]),
        ("traces", [(n, p.description) for n, p in PROFILES.items()]
         + [("PATH", "a CSV (num_prefill_tokens,num_decode_tokens[,arrived_at]) or JSONL trace file")]),
        ("models", [(n, m.description) for n, m in MODELS.items()]),
        ("gpus", [(n, g.description) for n, g in GPUS.items()]),
        ("cost models", [
            ("roofline", (f"published specs x efficiencies (mfu {DEFAULT_MFU}, mbu {DEFAULT_MBU}, "
                         f"attention mfu {DEFAULT_ATTN_MFU}), tile per GPU; "
                         "step overheads by execution mode:")),
            *((f"  {mode}", StepOverheads.defaults(mode, 32).describe() + " for 32 layers")
              for mode in EXECUTION_MODES),
            ("fitted", ("--cost cost_model.json of `simctl fit`: a simctl profile's steps, or operator "
                       "profiles (Vidur's layout) with the execution mode's step overheads; "
                       "summary.json: cost_assumptions")),
        ]),
    ):
        table = Table(title=title, show_header=False, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for name, text in rows:
            table.add_row(name, text)
        console.print(table)


class Interrupted(BaseException):
    """Ctrl-C or SIGTERM, raised where the program is so that it unwinds: `finally` blocks remove
    temporaries, a serving child or pool workers are stopped, and --out is left as it was. Not a
    KeyboardInterrupt, which typer would turn into a silent exit code."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.exit_code = 128 + signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM


def _raise_interrupted(signum: int, frame: object) -> None:
    raise Interrupted(signum)


def main(argv: list[str] | None = None) -> None:
    """Entry point: run the app non-standalone so that every error becomes one line on stderr, exit 2; an
    interruption (Ctrl-C, SIGTERM) stops children, removes temporaries and exits 130 (143 for SIGTERM)."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args:
        args = ["--help"]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _raise_interrupted)
    try:
        if given_value(args, ["--out"]) == "":
            raise InputError("--out is empty; give a folder")
        rv = app(args=args, prog_name="simctl", standalone_mode=False)
        sys.stdout.flush()  # a full disk or closed pipe fails here, not at exit
    except InputError as e:
        fail(str(e))
    except _USAGE_ERRORS as e:
        fail(usage_message(e, args, COMMANDS))
    except Interrupted as e:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the message short
            signal.signal(sig, signal.SIG_IGN)
        print("simctl: interrupted", file=sys.stderr)
        sys.exit(e.exit_code)
    except _ABORTS:  # click's answer to end of input at a prompt
        print("simctl: aborted", file=sys.stderr)
        sys.exit(1)
    except OSError as e:
        if e.filename is not None or e.errno not in (errno.ENOSPC, errno.EPIPE, errno.EIO, errno.EDQUOT):
            raise  # not writing stdout: a bug to report with its traceback
        _discard_stdout()
        fail(f"cannot write the output ({e.strerror or e})")
    sys.exit(rv if isinstance(rv, int) else 0)


def _discard_stdout() -> None:
    """Point stdout at /dev/null so that the interpreter's final flush of unwritable output stays quiet."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
