"""`simctl plan`: the fewest GPUs that serve a rate within an SLO (`studies.plan`), searched over policies,
their key settings, TP degrees and GPUs; the best choices with their GPUs, per-GPU goodput, headroom and cost,
every column explained under the table, a Pareto figure, and vllm-v1's choice as `vllm serve` flags."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from common.errors import InputError
from simctl.capacity_cmd import SLO_HELP
from simctl.configs import Deployment, Workload
from simctl.options import Attainment
from simctl.policy_options import PolicyLists

PLAN_FILES = ("plan.json", "probes.parquet", "pareto.png")
VLLM_POLICY = "vllm-v1"  # the policy that models `vllm serve`'s scheduler: its choice is printed as flags
FOOTNOTES = (
    ("GPUs: replicas x TP. capacity/replica: the highest rate one replica serves within the SLO (capacity "
     "search, sustainable definition); replicas: the rate over it, rounded up (+1 while the check failed)"),
    ("QPS/GPU: capacity per GPU (goodput); tok/s/GPU: output tokens/s per GPU at capacity; tok/s/user: "
     "1 / median TPOT at capacity"),
    ("headroom: the replicas' total capacity beyond the rate asked; $/M tok: --gpu-cost x GPUs per output "
     "token made at the rate, per million (refused requests make none)"),
    ("checked: a run of the replicas behind a least-outstanding router at the rate met the SLO (yes), did "
     "not (no), or was not run (-)"),
)


def parse_prices(values: list[str] | None) -> dict[str, float]:
    """`--gpu-cost a100-80gb=2.5[,h100=4]` (repeatable) -> {gpu: price per GPU-hour}; one line if
    malformed."""
    prices: dict[str, float] = {}
    for item in (t.strip() for v in values or [] for t in v.split(",")):
        gpu, sep, text = item.partition("=")
        try:
            prices[gpu.strip()] = float(text) if sep and gpu.strip() else float("nan")
        except ValueError:
            prices[gpu.strip()] = float("nan")
        if prices[gpu.strip()] != prices[gpu.strip()]:
            raise InputError(f"--gpu-cost {item!r}: give GPU=PRICE per GPU-hour, e.g. a100-80gb=2.5")
    return prices


def plan_cmd(
    rate: Annotated[float, typer.Option(help="Requests per second to serve.")],
    slo: Annotated[list[str], typer.Option(help=SLO_HELP, metavar="KEY=S[,KEY=S]")],
    policies: PolicyLists = PolicyLists(policy="vllm,sarathi"),
    workload: Workload = Workload(),
    deployment: Deployment = Deployment(),
    gpu_cost: Annotated[list[str] | None, typer.Option(metavar="GPU=PRICE[,...]", help=(
        "Price per GPU-hour of a GPU searched: adds the cost per million output tokens and ranks equal GPU "
        "counts by it."))] = None,
    max_gpus: Annotated[int, typer.Option(help="Most GPUs a choice may use.")] = 64,
    top: Annotated[int, typer.Option(help="Choices shown.")] = 5,
    checks: Annotated[int, typer.Option(help="The best choices checked by a cluster run at the rate.")] = 3,
    attainment: Attainment = None,
    num_requests: Annotated[int, typer.Option(help="Requests per probed run (per replica in a check).")
                            ] = 1000,
    workers: Annotated[int | None, typer.Option(help="Processes searching in parallel [default: one per "
                                                "core].")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for plan.json, probes.parquet (every probed run) "
                                             "and pareto.png.")] = None,
) -> None:
    """Size a deployment: the fewest GPUs serving --rate within --slo, over policies, their key settings
    (token budget: 256..2048 unless given), TP degrees and GPUs.

    Example: simctl plan --model llama-2-7b --gpu a100-80gb --trace sharegpt --rate 20 --slo
    p99_tbt=0.1,p50_ttft=1 --policy vllm-v1,sarathi --gpu-cost a100-80gb=2.5 --out out/plan
    """
    from results.output import check_out_dir
    from results.slo import parse_slo
    from simctl.option_grid import base_config, grid
    from studies.plan import KEY_SETTINGS, PlanSpec, plan

    combos = grid(base_config(workload, deployment, 1.0, num_requests), policies.policy, deployment,
                  _with_key_settings(policies.settings(), policies.policy, KEY_SETTINGS))
    spec = PlanSpec([c.config for c in combos], [c.label for c in combos], parse_slo(slo, attainment), rate,
                    max_gpus, parse_prices(gpu_cost), checks, workers)
    spec.validate()
    for c in spec.configs:
        c.validate()
    if top < 1:
        raise InputError(f"--top must be >= 1, got {top}")
    if out is not None:
        check_out_dir(out, PLAN_FILES)
    console = Console(width=max(Console().width, 150))  # a wide table: its captions explain every column
    console.print(escape(f"searching {len(combos)} configurations for {rate:g} QPS of {workload.trace} "
                         f"within {spec.slo.describe()}"))
    choices, capacities = plan(spec)
    console.print(plan_table(choices[:top], spec))
    for note in FOOTNOTES:
        console.print(escape(note), style="dim")
    flags = vllm_flags(choices[:top])
    if flags:
        console.print(escape(f"{VLLM_POLICY}'s best choice deploys as: {flags}"))
    warnings = {w for r in capacities for p in r.probes for w in p.get("warnings", [])}
    for w in sorted(warnings):
        print(f"simctl: warning: {w}", file=sys.stderr)
    if out is not None:
        from simctl.plan_files import write_plan

        write_plan(out, spec, choices, capacities)
        console.print(escape(f"wrote {out}/plan.json, probes.parquet, pareto.png"))


def _with_key_settings(options: dict[str, Any], policy: str, key: dict[str, tuple[int, ...]]
                       ) -> dict[str, Any]:
    """The settings given, and the key settings searched by default where a listed policy takes them."""
    from policies.registry import setting_names

    listed = {p.strip() for p in policy.split(",")}
    takes = setting_names()
    return {**{k: list(v) for k, v in key.items() if listed & set(takes.get(k, ()))},
            **{k: v for k, v in options.items() if v is not None}}


def plan_table(choices: list[Any], spec: Any) -> Table:
    from simctl.display import fmt_rate

    table = Table(title=escape(f"the fewest GPUs for {spec.rate:g} QPS ({len(spec.configs)} configurations "
                               "searched)"))
    for col in ("#", "configuration", "GPU", "TP", "replicas", "GPUs", "capacity/replica QPS", "QPS/GPU",
                "tok/s/GPU", "tok/s/user", "headroom", "$/M tok", "checked"):
        table.add_column(col, justify="right")
    for i, c in enumerate(choices, 1):
        cost = c.cost_per_million_tokens
        user = c.tokens_per_user
        table.add_row(str(i), escape(c.label), c.config.gpu, str(c.config.tp), str(c.replicas), str(c.gpus),
                      fmt_rate(c.capacity_qps), fmt_rate(c.qps_per_gpu), f"{c.tokens_per_gpu:.0f}",
                      "-" if user is None else f"{user:.1f}", f"{c.headroom:+.0%}",
                      "-" if cost is None else f"{cost:.3f}",
                      {True: "yes", False: "no", None: "-"}[c.checked])
    return table


def vllm_flags(choices: list[Any]) -> str | None:
    """The `vllm serve` command line of the best vllm-v1 choice (its settings as the run resolved them)."""
    from catalogue.models import get_model

    best = next((c for c in choices if c.config.policy == VLLM_POLICY), None)
    if best is None:
        return None
    s, cfg = best.at_capacity, best.config
    length = cfg.max_model_len or get_model(cfg.model).max_position
    flags = [f"--tensor-parallel-size {cfg.tp}", f"--max-num-batched-tokens {s['max_num_batched_tokens']}",
             f"--max-num-seqs {s['max_batch_size']}", f"--max-model-len {length}",
             f"--block-size {s['block_size']}",
             "--enable-prefix-caching" if s["enable_prefix_caching"] else "--no-enable-prefix-caching"]
    if s.get("long_prefill_token_threshold"):
        flags.append(f"--long-prefill-token-threshold {s['long_prefill_token_threshold']}")
    return (f"vllm serve <{get_model(cfg.model).name}'s weights> " + " ".join(flags)
            + f" on each of {best.replicas} replicas ({cfg.gpu})")
