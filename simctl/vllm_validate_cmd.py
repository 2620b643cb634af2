"""`simctl validate --engine vllm`: the simulated vllm-v1 twin against the installed vLLM
(simctl.validation.vllm_validate), its table on stdout and validation_vllm.{json,md,csv} in --out."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import typer

from simctl.common.errors import InputError
from simctl.traces.workload import Workload

DEFAULT_OUT = Path("out/validate-vllm")
# validate's options that only simctl's own engine (or a bench file) takes
SIMCTL_ONLY = ("device", "dtype", "attention", "threads", "prefill_instances", "decode_instances",
               "from_vllm_bench", "gpu", "tp", "goodput")


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def check_engine_options(ctx: typer.Context, engine: str, policy: str) -> None:
    """InputError for an option `validate --engine vllm` does not take (the twin is vllm-v1, on vLLM's CPU
    engine with vLLM's serving defaults)."""
    if engine not in ("simctl", "vllm"):
        raise InputError(f"--engine {engine!r}: choose simctl or vllm")
    if engine == "simctl":
        return
    from simctl.engine.vllm_real import TWIN_POLICY

    if _given(ctx, "policy") and policy != TWIN_POLICY:
        raise InputError(f"--policy {policy}: with --engine vllm the twin is {TWIN_POLICY}, vLLM's scheduler")
    wrong = [n for n in SIMCTL_ONLY if _given(ctx, n)]
    if wrong:
        raise InputError(f"--{wrong[0].replace('_', '-')} applies to --engine simctl; --engine vllm runs "
                         "vLLM's CPU engine with its serving defaults")


def vllm_validate_command(ctx: typer.Context, workload: Workload, loads: list[float], cost: str | None,
                          model: str, capacity: bool, repeats: int, out: Path) -> None:
    from simctl.validation.vllm_validate import VLLMValidation, markdown, validate_vllm

    if cost is None:
        raise InputError("--engine vllm needs --cost: the fit of vLLM's steps on this machine (`simctl "
                         "profile --engine vllm --out P`, then `simctl fit P`)")
    out = out if _given(ctx, "out") else DEFAULT_OUT
    if workload.num_requests is None:
        workload = replace(workload, num_requests=VLLMValidation().workload.num_requests)
    v = VLLMValidation(cost=cost, out=out, loads=tuple(loads), workload=workload, model=model,
                       repeats=repeats, capacity=capacity)
    try:
        report = validate_vllm(v, log=lambda line: print(line, file=sys.stderr))
    except RuntimeError as e:  # vLLM's engine failed, or a request did not get its tokens
        raise InputError(f"a real vLLM run failed: {e}") from None
    print(markdown(report))
