"""`simctl validate`: real runs and their simulated twins side by side on identical requests, and the
prediction errors; or vLLM against its twin (`simctl.vllm_validate_cmd`), or a vLLM bench result against its
prediction (`simctl.vllm_bench_cmd`)."""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer

from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.config_options import Without
from simctl.configs import RealDisaggregation
from simctl.options import ATTENTION_HELP
from simctl.traces.workload import Workload
from simctl.vllm_bench_cmd import BenchFile

# every run's requests; their rate is each load's. num_requests None: 300 per run (150 with --engine vllm)
VALIDATE_WORKLOAD = Workload(trace="sharegpt", qps=None, num_requests=None, scale=0.05)


@dataclass(frozen=True)
class RealRuns:
    """The real runs: their loads and how many of each."""

    loads: str = option_field("0.5,0.7", "Loads as fractions of each policy's simulated capacity (over 1: "
                              "beyond it, where a run may give up, its latencies n/a).")
    threads: int | None = option_field(None, "CPU threads of the real runs [default: the profile's].")
    capacity: bool = option_field(False, "Also bisect the real capacity (a few more real runs).")
    repeats: int = option_field(1, "Real runs per policy and load; measured values are their medians (a "
                                "shared machine's speed drifts from run to run).")

    def fractions(self) -> list[float]:
        try:
            return [float(x) for x in self.loads.split(",") if x.strip()]
        except ValueError:
            raise InputError(f"--loads {self.loads!r}: give comma-separated numbers, e.g. 0.5,0.7") from None


def validate(
    ctx: typer.Context,
    engine: Annotated[str, typer.Option(help=(
        "What the real runs run on: simctl (its own engine, each --policy) or vllm (the installed vLLM, "
        "`make vllm`, against the vllm-v1 twin priced by --cost, a fit of `simctl profile --engine vllm`; "
        "loads default 0.5,0.7,0.9, 150 requests per run; out/validate-vllm)."))] = "simctl",
    policy: Annotated[str, typer.Option(help=(
        "Policies to check: `all` or a comma-separated list (with --from-vllm-bench: the one policy "
        "predicting it [default: vllm-v1])."))] = "all",
    workload: Annotated[Workload, Without("qps")] = VALIDATE_WORKLOAD,
    runs: RealRuns = RealRuns(),
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
    disaggregation: RealDisaggregation = RealDisaggregation(),
    bench: BenchFile = BenchFile(),
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
    from simctl.vllm_bench_cmd import check_bench_options, vllm_bench_command
    from simctl.vllm_validate_cmd import check_engine_options, vllm_validate_command

    check_engine_options(ctx, engine, policy)
    check_bench_options(ctx, bench.from_vllm_bench)
    if bench.from_vllm_bench is not None:
        return vllm_bench_command(ctx, bench, model, policy, cost, out)
    fractions = runs.fractions()
    if engine == "vllm":
        if ctx.get_parameter_source("loads").name == "DEFAULT":
            fractions = [0.5, 0.7, 0.9]
        return vllm_validate_command(ctx, workload, fractions, cost, model, runs.capacity, runs.repeats, out)
    _on_simctl([p.strip() for p in policy.split(",") if p.strip()], workload, runs, fractions, cost, device,
               dtype, attention, model, disaggregation, out)


def _on_simctl(policies: list[str], workload: Workload, runs: RealRuns, fractions: list[float],
               cost: str | None, device: str, dtype: str | None, attention: str | None, model: str,
               disaggregation: RealDisaggregation, out: Path) -> None:
    """The validation of simctl's own engine: its report on stdout, its files in `out`."""
    from simctl.catalogue.gpus import get_gpu
    from simctl.costs.loader import default_cost_path
    from simctl.results.validation_report import markdown
    from simctl.validation.twin import DEFAULT_NUM_REQUESTS
    from simctl.validation.validate import validate_main

    if workload.num_requests is None:
        workload = replace(workload, num_requests=DEFAULT_NUM_REQUESTS)

    cost_path = cost if cost is not None else default_cost_path(get_gpu("cpu"))
    if cost_path is None:
        raise InputError("no cost model: give --cost (fit one with `simctl profile` and `simctl fit`)")
    try:
        report = validate_main(policies, workload, loads=fractions, cost=cost_path, out=out, model=model,
                               threads=runs.threads, capacity=runs.capacity, repeats=runs.repeats,
                               device=device, dtype=dtype, attention=attention,
                               prefill_instances=disaggregation.prefill_instances,
                               decode_instances=disaggregation.decode_instances,
                               log=lambda line: print(line, file=sys.stderr))
    except RuntimeError as e:
        raise InputError(f"a real run failed: {e}") from None
    print(markdown(report))
