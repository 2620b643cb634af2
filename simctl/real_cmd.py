"""`simctl real`: a trace served in real time on a real model, by simctl's engine under the simulator's
policy objects, or by the installed vLLM; the outputs have the simulator's format."""

from __future__ import annotations

import sys
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from simctl.common.errors import InputError
from simctl.configs import RealDisaggregation, Workload
from simctl.options import Attention, Eager
from simctl.policy_options import PolicyChoice


def real(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option(help="What serves the trace: simctl (its own engine, scheduled by "
                                        "--policy and its settings) or vllm (the installed vLLM and its own "
                                        "scheduler, which --policy vllm-v1 models: vllm-v1's settings given "
                                        "are passed to vLLM, --max-batch-size as its max_num_seqs; vLLM's "
                                        "defaults otherwise. `make vllm` installs it).")] = "simctl",
    policies: PolicyChoice = PolicyChoice(),
    workload: Workload = Workload(trace="sharegpt", qps=None, num_requests=None, scale=0.05),
    model: Annotated[str, typer.Option(help=(
        "Model shape, built with random weights (`tiny`, `tiny-2l` suit a CPU)."))] = "tiny",
    device: Annotated[str, typer.Option(help="cpu, or cuda.")] = "cpu",
    dtype: Annotated[str, typer.Option(help="float32, float16 or bfloat16.")] = "float32",
    threads: Annotated[int | None, typer.Option(help="CPU threads [default: every core available].")] = None,
    kv_capacity: Annotated[int | None, typer.Option(help="KV token slots given to the policy [default: "
                                                    "enough for every request at once]; --engine vllm: "
                                                    "the tokens its KV cache holds, in whole blocks "
                                                    "[default: vLLM's 1 GiB on the CPU].")] = None,
    attention: Attention = "auto",
    eager: Eager = None,
    disaggregation: RealDisaggregation = RealDisaggregation(),
    out: Annotated[Path | None, typer.Option(help="Folder for summary.json, requests.parquet, "
                                             "iterations.parquet and replicas.parquet, as `simctl run` "
                                             "(--engine vllm: the first three).")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Serve a trace in real time on a real model, driven by the same policy objects as the simulator.

    Timestamps are measured; the outputs have the simulator's format, so predictions can be checked. The
    default --scale makes sharegpt fit the tiny model's 2,048-token context.
    Example: simctl real --policy vllm --trace sharegpt --scale 0.05 --qps 4 --num-requests 50 --out out/real
    Disaggregated: simctl real --policy vllm --qps 4 --prefill-instances 1 --decode-instances 1
    --out out/real-pd
    On vLLM: simctl real --engine vllm --trace sharegpt --scale 0.05 --qps 4 --num-requests 60
    --out out/vllm-real
    (vLLM's settings as vllm-v1's, e.g. --max-batch-size 64 --enable-prefix-caching 0)
    """
    from simctl.engine.real import real_main

    if engine not in ("simctl", "vllm"):
        raise InputError(f"--engine {engine!r}: choose simctl or vllm")
    common = {"workload": workload, "model": model, "out": out, "dtype": dtype}
    try:
        if engine == "vllm":
            summary = _on_vllm(ctx, policies, common, kv_capacity)
        else:
            summary = real_main(policy=policies.policy, device=device, threads=threads,
                                options=policies.settings(), kv_capacity=kv_capacity, attention=attention,
                                eager=eager, **asdict(disaggregation), **common)
    except RuntimeError as e:
        # the serving child (or vLLM's engine) crashed: its last words are in the message
        raise InputError(f"real execution failed: {e}") from None
    _show(summary, as_json)


def _show(summary: dict[str, Any], as_json: bool) -> None:
    from simctl.display import print_cluster, print_summary
    from simctl.results.output import json_text

    if as_json:
        sys.stdout.write(json_text(summary))
        return
    print_summary(summary)
    if len(summary.get("replica_metrics", ())) > 1:
        print_cluster(summary)


def _on_vllm(ctx: typer.Context, policies: PolicyChoice, common: dict[str, Any], kv_capacity: int | None
             ) -> dict[str, Any]:
    """`simctl real --engine vllm`: InputError for an option only simctl's own engine takes; else the run."""
    from simctl.engine.vllm_real import TWIN_POLICY, engine_settings, vllm_real_main

    if ctx.get_parameter_source("policy").name != "DEFAULT" and policies.policy != TWIN_POLICY:
        raise InputError(f"--policy {policies.policy}: with --engine vllm the scheduler is vLLM's own, which "
                         f"--policy {TWIN_POLICY} models (its settings are passed to vLLM)")
    for name in ("device", "threads", "attention", "eager", "prefill_instances", "decode_instances"):
        if ctx.get_parameter_source(name).name != "DEFAULT":
            raise InputError(f"--{name.replace('_', '-')} applies to --engine simctl; vLLM runs on the CPU "
                             f"with its own threads and attention")
    return vllm_real_main(settings=engine_settings(policies.settings()), kv_capacity=kv_capacity, **common)
