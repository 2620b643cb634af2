"""`simctl query-set`: Baton's experiment (Tables 1-2): the time each method takes to complete a whole query
set, per batch size, simulated and, with --real, measured on this machine's engine next to the simulator's
twin."""

from __future__ import annotations

import json
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.configs import Execution
from simctl.display import out_console, progress_bar, ticker
from simctl.options import batch_sizes, policy_list

if TYPE_CHECKING:
    import pandas as pd

    from simctl.catalogue.gpus import GPUSpec
    from simctl.catalogue.models import ModelSpec
    from simctl.costs.base import CostModel

FILES = ("query_set.parquet", "summary.json")


@dataclass(frozen=True)
class RealQuerySet:
    """--real: the set served on this machine's engine, beside the simulator's twin of those runs."""

    real: bool = option_field(False, "Also serve the set on this machine's engine (random weights of "
                              "--real-model) and simulate its twin.", flags=("--real",))
    real_model: str = option_field("tiny", "Model of --real.")
    device: str = option_field("cpu", "Device of --real (cpu, cuda).")
    repeats: int = option_field(3, "Real runs per point with --real (their median).")
    real_cost: Path | None = option_field(None, "Fitted cost model of the --real device, for the twin "
                                          "(default: the fit shipped for cpu).")


def _real_point(policy: str, requests: list, batch: int, model: str, device: str, seed: int,
                real_cost: Path | None = None, repeats: int = 1,
                options: dict[str, int] | None = None) -> dict[str, Any]:
    """Real runs of the set (all queries at time 0, from a JSONL trace; the median completion time of
    `repeats`) and the simulator's twin of them, priced by `real_cost` (default: the fit shipped for this
    project's CPU)."""
    import statistics

    from simctl.catalogue.gpus import get_gpu
    from simctl.catalogue.models import get_model
    from simctl.costs.loader import default_cost_path, load_cost
    from simctl.engine.real import real_main
    from simctl.traces.workload import Workload
    from simctl.validation.twin import simulate_twin

    if real_cost is None and device != "cpu":
        raise InputError("--real-cost: give the fitted cost model (cost_model.json) of the --real device")

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "queries.jsonl"
        path.write_text("".join(json.dumps({"prompt_tokens": r.prompt_tokens,
                                            "output_tokens": r.output_tokens, "arrival_s": 0.0}) + "\n"
                                            for r in requests), encoding="utf-8")
        workload = Workload(trace=str(path), qps=None, num_requests=len(requests), seed=seed)
        runs = [real_main(policy=policy, workload=workload, model=model, device=device,
                          options={**(options or {}), "max_batch_size": batch})
                for _ in range(repeats)]
        cost = load_cost(real_cost or default_cost_path(get_gpu("cpu")), get_model(model), None).cost
        twin, _ = simulate_twin(runs[0], cost)
    real = statistics.median(r["makespan_s"] for r in runs)
    return {"real_completion_s": real, "real_min_s": min(r["makespan_s"] for r in runs),
            "real_max_s": max(r["makespan_s"] for r in runs), "twin_completion_s": twin["makespan_s"],
            "twin_error": twin["makespan_s"] / real - 1, "real_batch_size": runs[0]["max_batch_size"]}


def query_set_cmd(
    name: Annotated[str, typer.Option("--set", help="Query set: mixed (Table 1: 120 queries, long/short "
                                      "inputs and outputs 1:1:2) or short (Table 2: 30 short "
                                      "queries).")] = "short",
    policy: Annotated[str, typer.Option(help="Policies, comma-separated (the paper's four: hf-padded = its "
                                        "Benchmark, pd, baton, baton-pd).")] = "hf-padded,pd,baton,baton-pd",
    batch_size: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "2,4,6,8,10",
    model: Annotated[str, typer.Option(help="Model shape from the catalogue.")] = "llama-2-7b",
    gpu: Annotated[str, typer.Option(help="GPU from the catalogue (the paper: a6000 for mixed, rtx-4090 for "
                                     "short; cpu: this machine's shipped fit).")] = "rtx-4090",
    cost: Annotated[str | None, typer.Option(help="A fitted cost_model.json or roofline_calibration.json "
                                             "instead of the roofline.")] = None,
    execution: Execution = Execution(),
    overlap: Annotated[int, typer.Option(help="baton-pd's --overlap: 1 prefills waiting queries beside the "
                                         "batch's decode steps (the paper's asynchronous P&D decoupling); 0: "
                                         "they take turns.")] = 0,
    scale: Annotated[float, typer.Option(help="Multiply every length (e.g. 0.25 for a CPU-sized --real)."
                                         )] = 1.0,
    seed: Annotated[int, typer.Option(help="Seed of the lengths and their order.")] = 0,
    serving: RealQuerySet = RealQuerySet(),
    out: Annotated[Path | None, typer.Option(help="Folder for query_set.parquet and summary.json.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Completion time of a whole query set (every query there at time 0) per policy and batch size, and
    each policy's speedup over hf-padded (Baton, Section 5.2).

    Example: simctl query-set --set mixed --batch-size 4,8 --gpu a6000
    """
    from simctl.catalogue.gpus import get_gpu
    from simctl.catalogue.models import get_model
    from simctl.results.output import json_text, write_files
    from simctl.studies.query_set import query_set
    from simctl.usage_errors import warn_all

    policies, sizes = policy_list(policy), batch_sizes(batch_size)
    _check(scale, serving, out)
    requests = query_set(name, seed, scale)
    spec, g = get_model(model), get_gpu(gpu)
    price, kv, label, warnings = _priced(cost, execution, spec, g)
    warnings = [*warnings, *_past_context(spec, requests)]
    warn_all(warnings)
    with progress_bar("query-set points" + (" (served for real)" if serving.real else "")) as report:
        frame = _completions(name, requests, policies, sizes, price, kv, overlap, serving, seed,
                             ticker(report, len(sizes) * len(policies)))
    summary = {"set": name, "queries": len(requests), "model": spec.name, "gpu": g.name, "cost_model": label,
               "cost_assumptions": price.assumptions(),
               "scale": scale, "seed": seed, "overlap": overlap, "warnings": warnings,
               "rows": frame.to_dict("records")}
    if out is not None:
        write_files(out, {"query_set.parquet": lambda t: frame.to_parquet(t, index=False),
                          "summary.json": lambda t: t.write_text(json_text(summary))},
                          "the query-set results")
    if as_json:
        sys.stdout.write(json.dumps(summary, indent=1) + "\n")
        return
    _print(frame, summary, serving.real)


def _priced(cost: str | None, execution: Execution, spec: ModelSpec, gpu: GPUSpec
            ) -> tuple[CostModel, int, str, list[str]]:
    """The set's cost model (`costs.loader`; the roofline with the step overheads given), its deployment's KV
    capacity, label and warnings."""
    from simctl.costs.kv_capacity import kv_capacity_tokens
    from simctl.costs.loader import RooflineOptions, load_cost

    ms = execution.step_overhead_ms
    loaded = load_cost(cost, spec, gpu, 1, RooflineOptions(execution=execution.execution,
                                                           overhead_s=None if ms is None else ms / 1e3))
    return loaded.cost, kv_capacity_tokens(spec, gpu, 1, loaded.dtype_bytes, loaded.memory_bytes), \
        loaded.label, loaded.warnings


def _past_context(spec: ModelSpec, requests: list) -> list[str]:
    """A warning, not a refusal, for queries longer than the model's context: Baton's methods ran on Hugging
    Face, which applies RoPE at any position (the mixed set's long queries, ~6,000 tokens, pass Llama-2's
    4,096, and the paper's batch-4 row doubled them), and the simulator prices any length."""
    overrun = spec.context_overrun(requests)
    return [] if overrun is None else [f"past the context, simulated as Hugging Face runs it: {overrun}"]


def _check(scale: float, serving: RealQuerySet, out: Path | None) -> None:
    from simctl.results.output import check_out_dir

    if not scale > 0:
        raise InputError(f"--scale must be > 0, got {scale}")
    if serving.repeats < 1:
        raise InputError(f"--repeats must be >= 1, got {serving.repeats}")
    if out is not None:
        check_out_dir(out, FILES)


def _completions(name: str, requests: list, policies: list[str], sizes: list[int], price: CostModel, kv: int,
                 overlap: int, serving: RealQuerySet, seed: int, tick: Callable[[], None]) -> pd.DataFrame:
    """One row per batch size and policy: the set's completion time simulated (and with --real served, with
    its twin), and each policy's speedup over hf-padded when it is compared; `tick` after each row."""
    import pandas as pd

    from simctl.studies.query_set import completion_time

    rows = []
    for b in sizes:
        for p in policies:
            options = {"overlap": overlap} if p == "baton-pd" else {}
            row = {"set": name, "batch_size": b, "policy": p,
                   **completion_time(p, requests, b, price, kv, options)}
            if serving.real:
                row.update(_real_point(p, requests, b, serving.real_model, serving.device, seed,
                                       serving.real_cost, serving.repeats, options))
            rows.append(row)
            tick()
    frame = pd.DataFrame(rows)
    if "hf-padded" in policies:
        base = frame[frame["policy"] == "hf-padded"].set_index("batch_size")["completion_s"]
        frame["speedup_vs_hf_padded"] = frame["batch_size"].map(base) / frame["completion_s"]
        if serving.real:
            real_base = frame[frame["policy"] == "hf-padded"].set_index("batch_size")["real_completion_s"]
            frame["real_speedup_vs_hf_padded"] = (frame["batch_size"].map(real_base)
                                                  / frame["real_completion_s"])
    return frame


def _print(frame, summary: dict, real: bool) -> None:
    from rich.markup import escape
    from rich.table import Table

    overlap = ", baton-pd --overlap 1" if summary["overlap"] else ""
    table = Table(title=escape(f"query set {summary['set']}: {summary['model']} / {summary['gpu']}{overlap}"))
    cols = ["batch", "policy", "completion s",
            "speedup"] + (["real s (range)", "twin s", "twin error", "real speedup"]
                                                             if real else [])
    for c in cols:
        table.add_column(c, justify="left" if c == "policy" else "right", no_wrap=True)
    table.caption = (f"{summary['queries']} queries, all there at t=0; {summary['cost_model']}; speedup: "
                     "hf-padded's completion time over the policy's") + (
        "; real: this machine's engine, median of --repeats runs; twin: the simulator on the same queries, "
        "policy and KV" if real else "")
    for r in frame.to_dict("records"):
        speedup = r.get("speedup_vs_hf_padded")
        cells = [str(r["batch_size"]), r["policy"], f"{r['completion_s']:.2f}",
                 "-" if speedup is None else f"{speedup:.2f}x"]
        if real:
            rs = r.get("real_speedup_vs_hf_padded")
            cells += [f"{r['real_completion_s']:.2f} ({r['real_min_s']:.2f}-{r['real_max_s']:.2f})",
                      f"{r['twin_completion_s']:.2f}", f"{r['twin_error']:+.1%}", "-" if rs is None
                      else f"{rs:.2f}x"]
        table.add_row(*cells)
    out_console().print(table)
