"""`simctl prefill-bench`: Prepacking's experiment (prefill time per batch of full batching, length-ordered
batching and prepacking on a dataset's length profile), predicted by a cost model and, with --real, measured
on this machine's engine next to the prediction."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.display import out_console, progress_bar, ticker
from simctl.options import batch_sizes, comma_list, policy_list

if TYPE_CHECKING:
    import numpy as np

    from simctl.catalogue.gpus import GPUSpec
    from simctl.catalogue.models import ModelSpec
    from simctl.costs.base import CostModel

FILES = ("prefill_bench.parquet", "summary.json")


@dataclass(frozen=True)
class PromptPools:
    """The prompts: a pool of lengths drawn from each profile."""

    lengths: str = option_field("mmlu", "Length profiles from Prepacking's Table 2 (mmlu, samsum, alpaca, "
                                "wikitext256, wikitext512, hh-rlhf) or files of one prompt length per line, "
                                "comma-separated.")
    prompts: int = option_field(1000, "Prompts drawn from each profile (the paper subsamples 1,000).")
    scale: float = option_field(1.0, "Multiply prompt lengths (e.g. 0.25 for a CPU-sized --real).")
    seed: int = option_field(0, "Seed of the lengths and their order.")


@dataclass(frozen=True)
class RealPrefills:
    """--real: the first prefills of each point timed on this machine's engine."""

    real: bool = option_field(False, "Also run the first --real-batches prefills of each point on this "
                              "machine's engine (random weights) and time them.", flags=("--real",))
    real_batches: int = option_field(3, "Prefills timed per point with --real.")
    repeats: int = option_field(3, "Timings per prefill with --real (their median).")
    device: str = option_field("cpu", "Device of --real (cpu, cuda).")


def prefill_bench(
    policy: Annotated[str, typer.Option(help="Policies that prefill whole batches, comma-separated: "
                                        "hf-padded (full batching), length-ordered, prepack, "
                                        "faster-transformer.")] = "hf-padded,length-ordered,prepack",
    batch_size: Annotated[str, typer.Option(help="Batch sizes, comma-separated.")] = "8,16,32,64",
    model: Annotated[str, typer.Option(help="Model shape from the catalogue.")] = "llama-2-7b",
    gpu: Annotated[str,
                   typer.Option(help="GPU from the catalogue (cpu: this machine's shipped fit).")] = "a6000",
    cost: Annotated[str | None, typer.Option(help="A fitted cost_model.json or roofline_calibration.json "
                                             "instead of the roofline.")] = None,
    pools: PromptPools = PromptPools(),
    timing: RealPrefills = RealPrefills(),
    out: Annotated[Path | None,
                   typer.Option(help="Folder for prefill_bench.parquet and summary.json.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the results as JSON.")] = False,
) -> None:
    """Prefill time per batch, speedup over full batching, batch-size reduction n/k, max absolute deviation,
    peak memory and the largest batch that fits, per policy, length profile and batch size (Prepacking,
    Sections 4.3-4.7). TTFT is the prefill time here: the prefill samples every prompt's first token, and
    every prompt of a batch arrives with it.

    Example: simctl prefill-bench --lengths mmlu,samsum --batch-size 16,64 --model sheared-llama-1.3b
    """
    import pandas as pd

    from simctl.catalogue.gpus import get_gpu
    from simctl.catalogue.models import get_model
    from simctl.costs.loader import load_cost
    from simctl.results.output import check_out_dir, json_text, write_files
    from simctl.usage_errors import warn_all

    policies = policy_list(policy)
    sizes = batch_sizes(batch_size)
    if pools.prompts < 1 or timing.real_batches < 1 or timing.repeats < 1:
        raise InputError("--prompts, --real-batches and --repeats must be >= 1")
    if out is not None:
        check_out_dir(out, FILES)
    spec, g = get_model(model), get_gpu(gpu)
    loaded = load_cost(cost, spec, g)
    price, label, warnings = loaded.cost, loaded.label, loaded.warnings
    warn_all(warnings)
    rows, profiles = [], {}
    drawn = _pools(pools, spec, timing, max(sizes))
    with progress_bar("prefill-bench points" + (" (timed for real)" if timing.real else "")) as report:
        tick = ticker(report, len(drawn) * len(sizes) * len(policies))
        for name, pool in drawn.items():
            profiles[name] = _profile(pool, name)
            rows += _points(name, pool, policies, sizes, spec, g, price, timing, pools.seed, tick)
    frame = pd.DataFrame(rows)
    summary = {"model": spec.name, "gpu": g.name, "cost_model": label, "warnings": warnings,
               "prompts": pools.prompts, "scale": pools.scale, "seed": pools.seed, "profiles": profiles,
               "real": timing.real, "device": timing.device if timing.real else None,
               "real_batches": timing.real_batches if timing.real else None}
    if out is not None:
        write_files(out, {"prefill_bench.parquet": lambda t: frame.to_parquet(t, index=False),
                          "summary.json": lambda t: t.write_text(json_text(summary))}, "the benchmark")
    if as_json:
        print(json.dumps({**summary, "points": rows}, indent=1))
        return
    _print(frame, summary)


def _pools(pools: PromptPools, spec: ModelSpec, timing: RealPrefills, batch_size: int
           ) -> dict[str, np.ndarray]:
    """Every prompt pool, drawn; with --real, the model checked against this machine's memory before any
    work."""
    if not pools.scale > 0:
        raise InputError(f"--scale must be > 0, got {pools.scale}")
    drawn = {name: _pool(name, pools, spec) for name in comma_list(pools.lengths, "lengths")}
    if timing.real:
        from simctl.engine.prefill_bench import check_memory

        check_memory(spec, list(drawn.values()), batch_size, timing.device)
    return drawn


def _pool(name: str, pools: PromptPools, spec: ModelSpec) -> np.ndarray:
    """The prompt lengths drawn from profile `name`; InputError if one exceeds the model's context."""
    from simctl.studies.prefill_bench import prompt_lengths

    pool = prompt_lengths(name, pools.prompts, pools.seed, pools.scale)
    if pool.max() > spec.max_position:
        raise InputError(f"--lengths {name}: prompts up to {pool.max()} tokens exceed {spec.name}'s "
                         f"context of {spec.max_position}; lower --scale")
    return pool


def _profile(pool: np.ndarray, name: str) -> dict[str, Any]:
    """The pool drawn, beside Prepacking's Table 2 for a named profile."""
    from simctl.studies.prefill_bench import PROFILES

    table = PROFILES.get(name)
    return {"sampled_min_mean_max": [int(pool.min()), float(pool.mean()), int(pool.max())],
            "table_min_mean_max": None if table is None else [table.min, table.mean, table.max],
            "lognormal_mu_sigma": None if table is None else list(table.lognormal())}


def _points(name: str, pool: np.ndarray, policies: list[str], sizes: list[int], spec: ModelSpec, g: GPUSpec,
            price: CostModel, timing: RealPrefills, seed: int, tick: Callable[[], None]
            ) -> list[dict[str, Any]]:
    """One row per batch size and policy on this pool: predicted, and with --real measured too; `tick` after
    each row."""
    import numpy as np

    from simctl.studies.prefill_bench import bench, largest_batch

    fits = {p: largest_batch(p, pool, spec, g.memory_bytes) for p in policies}
    rows: list[dict[str, Any]] = []
    for b in sizes:
        base = None
        for p in policies:
            point, times = bench(p, pool, b, price, spec)
            row = {"lengths": name, **point.__dict__, "largest_batch": fits[p]}
            if p == "hf-padded":
                base = point.prefill_s
            if timing.real:
                from simctl.engine.prefill_bench import measure_prefills

                measured = measure_prefills(p, pool, b, spec, timing.device, timing.real_batches,
                                            timing.repeats, seed)
                predicted = times[:len(measured)]
                row.update(real_prefill_s=float(np.mean(measured)),
                           predicted_first_s=float(np.mean(predicted)),
                           real_error=float(np.mean(predicted) / np.mean(measured) - 1))
            rows.append(row)
            tick()
        for row in rows[-len(policies):]:
            row["speedup_vs_hf_padded"] = None if base is None else base / row["prefill_s"]
    return rows


def _print(frame, summary: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    table = Table(
        title=escape(f"prefill per batch: {summary['model']} / {summary['gpu']} ({summary['cost_model']})"))
    # short headers, explained by the caption
    cols = ["lengths", "batch", "policy", "pred. ms", "speedup", "n/k", "MAD", "peak GiB", "max batch"]
    if summary["real"]:
        cols += ["real first ms", "pred. first ms", "error"]
    for c in cols:
        table.add_column(c, justify="left" if c in ("lengths", "policy") else "right", no_wrap=True)
    table.caption = ("pred. ms: the mean prefill of all the pool's batches, priced; speedup: over "
                     "hf-padded; n/k: prompts per computed row; MAD: longest minus mean prompt; peak GiB: "
                     f"estimated; max batch: the largest (of {summary['prompts']}) whose prefills fit"
                     + (f"; real first ms: the mean of the first {summary['real_batches']} prefills measured "
                        "on this machine (each the median of --repeats); pred. first ms: those same "
                        "prefills priced; error: pred. first over real first. A few prefills are a small "
                        "sample: their prompts change with the batch size (hf-padded pads every one to the "
                        "longest), and a burst of other work on the machine moves a whole point"
                        if summary["real"]
                        else ""))
    for r in frame.to_dict("records"):
        cells = [escape(r["lengths"]), str(r["batch_size"]), r["policy"], f"{r['prefill_s'] * 1e3:.2f}",
                 "-" if r["speedup_vs_hf_padded"] is None else f"{r['speedup_vs_hf_padded']:.2f}x",
                 f"{r['batch_reduction']:.2f}", f"{r['max_abs_deviation']:.0f}", f"{r['peak_gib']:.2f}",
                 str(r["largest_batch"])]
        if summary["real"]:
            cells += [f"{r['real_prefill_s'] * 1e3:.1f}", f"{r['predicted_first_s'] * 1e3:.1f}",
                      f"{r['real_error']:+.1%}"]
        table.add_row(*cells)
    console = out_console()
    console.print(table)
    for name, p in summary["profiles"].items():
        lo, mean, hi = p["sampled_min_mean_max"]
        ref = p["table_min_mean_max"]
        console.print(escape(f"{name}: sampled min/mean/max {lo}/{mean:.0f}/{hi}"
                             + (f" (Prepacking Table 2: {ref[0]}/{ref[1]}/{ref[2]}; shifted log-normal, "
                                f"sigma {p['lognormal_mu_sigma'][1]:.2f})" if ref else "")))
