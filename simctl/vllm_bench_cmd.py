"""`simctl validate --from-vllm-bench FILE`: a user's `vllm bench serve` result beside simctl's prediction
(simctl.validation.vllm_bench_compare), as a table, and vllm_bench_comparison.json / .md in --out."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.display import out_console

DEFAULT_OUT = Path("out/vllm-bench")
# validate's options for real runs: none applies to a measurement that is already made
REAL_RUN_OPTIONS = ("trace", "loads", "device", "dtype", "attention", "scale", "num_requests", "seed",
                    "threads", "capacity", "repeats", "prefill_instances", "decode_instances")
BENCH_OPTIONS = ("gpu", "tp", "goodput")


@dataclass(frozen=True)
class BenchFile:
    """`validate`'s options for a bench result: the file, and what the bench ran on and measured."""

    from_vllm_bench: Path | None = option_field(None, (
        "Instead of real runs: a result of `vllm bench serve --save-result --save-detailed`, predicted on "
        "the same requests (their lengths, sent when the bench sent them) and shown beside it under vLLM's "
        "metric names, with the errors; needs --model and --gpu; writes vllm_bench_comparison.json and .md "
        "[--out default: out/vllm-bench]."))
    gpu: str | None = option_field(None, "With --from-vllm-bench: the GPU the bench ran on (catalogue).")
    tp: int = option_field(1, "With --from-vllm-bench: the server's tensor-parallel degree.")
    goodput: list[str] | None = option_field(None, (
        "With --from-vllm-bench: the bench's --goodput limits (ttft, tpot, e2el) in ms unless a unit is "
        "given (500ms, 0.5s), to compare "
        "request_goodput (the file keeps vLLM's value, not its limits)."), metavar="KEY:MS[,KEY:MS]")


def _given(ctx: typer.Context, name: str) -> bool:
    source = ctx.get_parameter_source(name)
    return source is not None and source.name != "DEFAULT"


def check_bench_options(ctx: typer.Context, from_bench: Path | None) -> None:
    """InputError for an option of the other kind of validation than the one asked for."""
    if from_bench is None:
        wrong = [n for n in BENCH_OPTIONS if _given(ctx, n)]
        if wrong:
            raise InputError(f"--{wrong[0]} applies to --from-vllm-bench")
        return
    wrong = [n for n in REAL_RUN_OPTIONS if _given(ctx, n)]
    if wrong:
        raise InputError(f"--{wrong[0].replace('_', '-')} applies to real runs; --from-vllm-bench compares "
                         "a measurement already made (it takes --model, --gpu, --tp, --policy, --cost, "
                         "--goodput and --out)")
    missing = [n for n in ("model", "gpu") if not _given(ctx, n)]
    if missing:
        raise InputError(f"--from-vllm-bench needs --{missing[0]}: the model the bench served (a catalogue "
                         "name or its config.json) and the GPU it ran on (see `simctl list`)")


def vllm_bench_command(ctx: typer.Context, bench: BenchFile, model: str, policy: str, cost: str | None,
                       out: Path) -> None:
    """The comparison of the bench result (validate's options, checked by check_bench_options)."""
    from rich.console import Console
    from rich.markup import escape

    from simctl.results.output import check_out_dir
    from simctl.results.vllm_bench import parse_goodput
    from simctl.usage_errors import note_replaced, warn_all
    from simctl.validation.vllm_bench_compare import DEFAULT_POLICY, FILES, compare, write_comparison

    limits = parse_goodput(bench.goodput)
    out = check_out_dir(out if _given(ctx, "out") else DEFAULT_OUT, FILES)
    c = compare(bench.from_vllm_bench, model, bench.gpu, policy if _given(ctx, "policy") else DEFAULT_POLICY,
                cost, bench.tp, limits)
    warn_all(c.warnings)
    note_replaced(out, FILES)
    write_comparison(c, out)
    _print(c.record())
    Console().print(escape(f"wrote {out}/{FILES[0]} and {FILES[1]}"))


def _print(record: dict[str, Any]) -> None:
    from rich.markup import escape
    from rich.table import Table

    from simctl.results.validation_report import fmt_err
    from simctl.results.vllm_bench import ITL_PERCENTILES
    from simctl.validation.vllm_bench_compare import fmt_value

    p = record["prediction"]
    title = (f"{Path(record['file']).name}: {record['completed']}/{record['sent']} requests measured; "
             f"predicted by {p['policy']} on {p['model']} / {p['gpu']} x{p['tp']} ({p['cost_model']})")
    table = Table(title=escape(title))
    for col in ("metric", "measured", "predicted", "error"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for r in record["metrics"]:
        table.add_row(r["metric"], fmt_value(r["measured"]), fmt_value(r["predicted"]),
                      fmt_err(r["error_pct"]))
    console = out_console()
    console.print(table)
    for line in (*record["assumptions"], f"predicted {ITL_PERCENTILES}"):
        console.print(escape(f"assumed: {line}"))
