"""`simctl plan`: the fewest GPUs that serve a rate within an SLO (`studies.plan`), searched over policies,
their key settings, TP degrees and GPUs; the best choices with their GPUs, per-GPU goodput, headroom and cost,
every column explained under the table, a Pareto figure, and vllm-v1's choice as `vllm serve` flags."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from simctl.capacity_cmd import SLO_HELP
from simctl.common.errors import InputError
from simctl.config_options import Without
from simctl.configs import Deployment, Execution, Workload
from simctl.options import Attainment
from simctl.policy_options import PolicyLists
from simctl.usage_errors import warn_all

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

    from simctl.sim.run import RunConfig
    from simctl.studies.capacity import Capacity
    from simctl.studies.plan import Candidate, Choice, PlanSpec

PLAN_FILES = ("plan.json", "probes.parquet", "pareto.png")
VLLM_POLICY = "vllm-v1"  # the policy that models `vllm serve`'s scheduler: its choice is printed as flags
# vLLM's disaggregated serving joins a prefill and a decode instance by a KV connector (NIXL in its examples)
KV_CONNECTOR = """--kv-transfer-config '{"kv_connector":"NixlConnector","kv_role":"kv_both"}'"""
FOOTNOTES = (
    ("replica: one instance of TP GPUs, or with P/D P:D a unit of P prefill-only and D decode-only "
     "instances (TP GPUs each) joined by a KV link; GPUs: replicas x the GPUs of one"),
    ("QPS/replica: the highest rate one replica serves within the SLO (capacity search, sustainable "
     "definition); replicas: the rate over it, rounded up (+1 while the check failed)"),
    ("QPS/GPU: capacity per GPU (goodput); tok/s/GPU: output tokens/s per GPU at capacity; tok/s/user: "
     "1 / median TPOT at capacity"),
    ("headroom: the replicas' total capacity beyond the rate asked; $/M tok: --gpu-cost x GPUs per output "
     "token made at the rate, per million (refused requests make none)"),
    ("checked: a run of the replicas behind a least-outstanding router at the rate met the SLO (yes), did "
     "not (no), or was not run (-: an estimate from one replica's capacity); checked choices are ranked "
     "first"),
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


def parse_splits(text: str) -> list[tuple[int, int]]:
    """`--pd-splits 1:1,1:2` -> [(1, 1), (1, 2)]; `none` -> []."""
    if text.strip() == "none":
        return []
    splits = []
    for item in (t.strip() for t in text.split(",")):
        p, sep, d = item.partition(":")
        if not (sep and p.isdigit() and d.isdigit() and int(p) >= 1 and int(d) >= 1):
            raise InputError(f"--pd-splits {item!r}: give PREFILL:DECODE instances, e.g. 1:2, or none")
        splits.append((int(p), int(d)))
    return splits


def plan_cmd(
    rate: Annotated[float, typer.Option(help="Requests per second to serve (offered: those refused as too "
                                        "long included).")],
    slo: Annotated[list[str], typer.Option(help=SLO_HELP, metavar="KEY=S[,KEY=S]")],
    policies: PolicyLists = PolicyLists(policy="vllm,sarathi"),
    workload: Annotated[Workload, Without("qps")] = Workload(trace="sharegpt", qps=1.0),
    deployment: Deployment = Deployment(),
    execution: Execution = Execution(),
    pd_splits: Annotated[str, typer.Option(help=(
        "Disaggregated units searched too, PREFILL:DECODE instances (comma list; none: colocated only), "
        "for the policies that can serve so, with their default settings unless given."))] = "1:1,1:2,2:1",
    kv_link_gbps: Annotated[float | None, typer.Option(help=(
        "Bandwidth of a P/D unit's KV link, Gbit/s [default: the GPU's interconnect, one way, e.g. 2400 "
        "on a100-80gb's NVLink: the unit's instances on one node]."))] = None,
    gpu_cost: Annotated[list[str] | None, typer.Option(metavar="GPU=PRICE[,...]", help=(
        "Price per GPU-hour of a GPU searched: adds the cost per million output tokens and ranks equal GPU "
        "counts by it."))] = None,
    max_gpus: Annotated[int, typer.Option(help="Most GPUs a choice may use.")] = 64,
    top: Annotated[int, typer.Option(help="Choices shown.")] = 5,
    checks: Annotated[int, typer.Option(help=(
        "The best choices checked by a cluster run at the rate, at least (then every choice estimated at "
        "fewer GPUs than the best checked one, so that the answer is the fewest GPUs a check passed; 0: "
        "estimates only)."))] = 3,
    attainment: Attainment = None,
    workers: Annotated[int | None, typer.Option(help="Processes searching in parallel [default: one per "
                                                "core].")] = None,
    out: Annotated[Path | None, typer.Option(help="Folder for plan.json, probes.parquet (every probed run) "
                                             "and pareto.png.")] = None,
) -> None:
    """Size a deployment: the fewest GPUs serving --rate within --slo, over policies, their key settings
    (token budget: 256..2048 unless given), TP degrees, GPUs and P/D splits.

    Example: simctl plan --model llama-2-7b --gpu a100-80gb --trace sharegpt --rate 20 --slo
    p99_tbt=0.1,p50_ttft=1 --policy vllm-v1,sarathi --gpu-cost a100-80gb=2.5 --out out/plan
    """
    from simctl.option_grid import base_config
    from simctl.results.output import check_out_dir
    from simctl.results.slo import parse_slo
    from simctl.studies.plan import PlanSpec, fitting, plan

    found = candidates(base_config(workload, deployment, execution), policies.policy, deployment,
                       policies.settings(), parse_splits(pd_splits), kv_link_gbps)
    fit, unfit = fitting(found)
    spec = PlanSpec(fit, parse_slo(slo, attainment), rate, max_gpus, parse_prices(gpu_cost), checks,
                    workers)
    spec.validate()
    if top < 1:
        raise InputError(f"--top must be >= 1, got {top}")
    if out is not None:
        check_out_dir(out, PLAN_FILES)
    console = _wide_console()
    _announce(console, unfit, spec, workload.trace)
    with plan_progress() as report:
        choices, capacities = plan(spec, report)
    show(console, choices[:top], spec)
    warn_all(sorted({w for r in capacities for p in r.probes for w in p.get("warnings", [])}))
    if out is not None:
        _save(console, out, spec, choices, capacities, top)


def _announce(console: Console, unfit: dict[str, list[Candidate]], spec: PlanSpec, trace: str) -> None:
    """The configurations skipped (the reason names the model, GPU and TP; a few are named too) and what the
    plan searches."""
    from rich.markup import escape

    for reason, skipped in unfit.items():
        named = f" ({', '.join(c.label for c in skipped)})" if len(skipped) <= 3 else ""
        console.print(escape(f"skipped {len(skipped)} configuration{'s' if len(skipped) > 1 else ''}{named}: "
                             f"{reason}"))
    console.print(escape(f"searching {len(spec.candidates)} configurations for {spec.rate:g} QPS of {trace} "
                         f"within {spec.slo.describe()}"))


def _save(console: Console, out: Path, spec: PlanSpec, choices: list[Choice], capacities: list[Capacity],
          top: int) -> None:
    from rich.markup import escape

    from simctl.plan_files import write_plan

    write_plan(out, spec, choices, capacities, top)
    console.print(escape(f"wrote {out}/plan.json, probes.parquet, pareto.png"))


def _wide_console() -> Console:
    """The terminal's console, at least 150 columns wide: the plan's table has captions for every column."""
    from rich.console import Console

    return Console(width=max(Console().width, 150))


@contextmanager
def plan_progress() -> Iterator[Callable[[str, int, int], None] | None]:
    """A bar on stderr while it is a terminal, fed (stage, done, total): the capacity searches, then each
    batch of checks."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task("plan", total=None)
        yield lambda what, done, total: bar.update(task, description=escape(what), completed=done,
                                                   total=total)


def candidates(base: RunConfig, policy: str, deployment: Deployment, options: dict[str, Any],
               splits: list[tuple[int, int]], kv_link_gbps: float | None) -> list[Candidate]:
    """Every colocated combination (key settings searched by default), then each P/D split of the policies
    that can serve disaggregated, with the settings given only (their defaults otherwise)."""
    from simctl.option_grid import grid
    from simctl.policies.registry import policy_class
    from simctl.studies.plan import KEY_SETTINGS, Candidate, link_gbps

    found = [Candidate(c.config, c.label) for c in grid(base, policy, deployment,
                                                        _with_key_settings(options, policy, KEY_SETTINGS))]
    split_policies = ",".join(p for p in dict.fromkeys(t.strip() for t in policy.split(","))
                              if not policy_class(p).padded_batches)
    if not splits or not split_policies or base.pp > 1:  # pipeline stages serve colocated only
        return found
    given = {k: v for k, v in options.items() if v is not None}
    for c in grid(base, split_policies, deployment, given):
        link = kv_link_gbps if kv_link_gbps is not None else link_gbps(c.config.gpu)
        found += [Candidate(c.config, f"{c.label} P/D {p}:{d}", (p, d), link) for p, d in splits]
    return found


def _with_key_settings(options: dict[str, Any], policy: str, key: dict[str, tuple[int, ...]]
                       ) -> dict[str, Any]:
    """The settings given, and the key settings searched by default where a listed policy takes them."""
    from simctl.policies.registry import setting_names

    listed = {p.strip() for p in policy.split(",")}
    takes = setting_names()
    return {**{k: list(v) for k, v in key.items() if listed & set(takes.get(k, ()))},
            **{k: v for k, v in options.items() if v is not None}}


def show(console: Console, choices: list[Choice], spec: PlanSpec) -> None:
    """The table, what every column means, the requests refused, the answer and its `vllm serve` flags."""
    from rich.markup import escape

    console.print(plan_table(choices, spec))
    for note in FOOTNOTES:
        console.print(escape(note), style="dim")
    at = choices[0].at_capacity
    if at.get("rejected"):
        console.print(escape(
            f"refused: {choices[0].refused_share:.0%} of the requests offered need more than the max model "
            f"length, {at['max_model_len']} positions (as a server refuses them); rates count them, latency "
            "percentiles do not, and they miss a per-request SLO"))
    best = choices[0]
    state = {True: f"a run at {spec.rate:g} QPS met the SLO", None: "not checked", False: "its check failed"}
    console.print(escape(f"answer: {best.label}, {best.gpus} x {best.config.gpu} ({best.replicas} replicas "
                         f"x {best.candidate.gpus} GPU{'s' if best.candidate.gpus > 1 else ''}; "
                         f"{state[best.checked]})"), style="bold")
    flags = vllm_flags(choices)
    if flags:
        console.print(escape(f"{VLLM_POLICY}'s best choice deploys as: {flags}"))


def plan_table(choices: list[Choice], spec: PlanSpec) -> Table:
    from rich.markup import escape
    from rich.table import Table

    from simctl.display import fmt_rate

    configs = [c.config for c in spec.candidates]
    shared = [f"{v}" for k, v in (("model", configs[0].model), ("gpu", configs[0].gpu)) if
              len({getattr(c, k) for c in configs}) == 1]
    if len({c.tp for c in configs}) == 1:
        shared.append(f"TP {configs[0].tp}")
    table = Table(title=escape(f"the fewest GPUs for {spec.rate:g} QPS ({', '.join(shared)}; "
                               f"{len(configs)} configurations searched)"))
    table.add_column("#", justify="right")
    table.add_column("configuration", no_wrap=True)
    for col in ("replicas", "GPUs", "QPS/replica", "QPS/GPU", "tok/s/GPU", "tok/s/user", "headroom",
                "$/M tok", "checked"):
        table.add_column(col, justify="right")
    for i, c in enumerate(choices, 1):
        cost = c.cost_per_million_tokens
        user = c.tokens_per_user
        table.add_row(str(i), escape(c.label), str(c.replicas), str(c.gpus), fmt_rate(c.capacity_qps),
                      fmt_rate(c.qps_per_gpu), f"{c.tokens_per_gpu:.0f}",
                      "-" if user is None else f"{user:.1f}",
                      f"{c.headroom:+.0%}", "-" if cost is None else f"{cost:.3f}",
                      {True: "yes", False: "no", None: "-"}[c.checked])
    return table


def vllm_flags(choices: list[Choice]) -> str | None:
    """The `vllm serve` command line of the best vllm-v1 choice (its settings as the run resolved them; every
    flag one of vLLM 0.32's, `tests/test_plan_vllm_flags.py` parses them with vLLM's own parser)."""
    best = next((c for c in choices if c.config.policy == VLLM_POLICY), None)
    if best is None:
        return None
    flags, model = serve_flags(best.at_capacity, best.config)
    split = best.candidate.split
    where = (f"on each of {best.replicas} replicas ({best.config.gpu})" if split is None else
             f"on each of {best.replicas * split[0]} prefill and {best.replicas * split[1]} decode instances "
             f"({best.config.gpu}), with {KV_CONNECTOR}")
    return f"vllm serve <{model}'s weights> {flags} {where}"


def serve_flags(s: dict[str, Any], config: RunConfig) -> tuple[str, str]:
    """A vllm-v1 run's settings (`s`: its summary) as `vllm serve` flags, and the model's name."""
    from simctl.catalogue.models import get_model

    model, sizing = get_model(config.model), config.kv_sizing
    flags = [f"--tensor-parallel-size {config.tp}", f"--max-num-batched-tokens {s['max_num_batched_tokens']}",
             f"--max-num-seqs {s['max_batch_size']}",
             f"--max-model-len {config.max_model_len or model.max_position}",
             f"--block-size {s['block_size']}", f"--gpu-memory-utilization {sizing.gpu_memory_utilization}",
             "--enable-prefix-caching" if s["enable_prefix_caching"] else "--no-enable-prefix-caching"]
    flags += [flag for flag, given in (("--quantization fp8", sizing.dtype == "fp8"),
                                       (f"--dtype {sizing.dtype}", sizing.dtype in ("bfloat16", "float16")),
                                       ("--kv-cache-dtype fp8", sizing.kv_cache_dtype == "fp8")) if given]
    if s.get("long_prefill_token_threshold"):
        flags.append(f"--long-prefill-token-threshold {s['long_prefill_token_threshold']}")
    if config.pp > 1:
        flags.insert(1, f"--pipeline-parallel-size {config.pp}")
    return " ".join(flags), model.name
