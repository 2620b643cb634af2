"""Options that commands declare one by one (typer annotations) and the parsing of list options, in one place
for every command module; options that come in groups are sections (`simctl.configs`)."""

from __future__ import annotations

from typing import Annotated

import typer

from simctl.common.errors import InputError
from simctl.executor.config import ATTENTION
from simctl.traces.workload import SEED_HELP, TRACE_HELP

Trace = Annotated[str, typer.Option(help=TRACE_HELP)]
Seed = Annotated[int, typer.Option(help=SEED_HELP)]
Attainment = Annotated[float | None, typer.Option(help="Share of requests that must meet the per-request "
                                                  "--slo limits [default: 0.9].")]
ATTENTION_HELP = ("SDPA kernels of the attention: " + "; ".join(f"{k}: {v}" for k, v in ATTENTION.items())
                  + ". cuDNN re-plans for every new KV length, which serving meets every step. A fit prices "
                  "only runs made with the kernels it was profiled with.")
Attention = Annotated[str, typer.Option(help=ATTENTION_HELP)]
Eager = Annotated[bool | None, typer.Option(
    "--eager/--cuda-graphs", help="Launch every kernel from Python (eager), or replay decode steps from CUDA "
    "graphs captured per batch-size bucket, the batch padded to its bucket (CUDA only) [default: CUDA graphs "
    "on a GPU, eager on a CPU and for a mixture of experts]. A fit prices only runs made in the mode it was "
    "profiled in.")]


def comma_list(text: str, what: str) -> list[str]:
    """The items of a comma-separated option value (`--policy a,b`); InputError if there are none."""
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise InputError(f"--{what}: give at least one value")
    return items


def policy_list(text: str) -> list[str]:
    """The policies of a `--policy` comma list, each known (the registry's one line if not)."""
    from simctl.policies.registry import policy_class

    policies = comma_list(text, "policy")
    for p in policies:
        policy_class(p)
    return policies


def batch_sizes(text: str) -> list[int]:
    try:
        sizes = [int(t) for t in comma_list(text, "batch-size")]
    except ValueError:
        raise InputError(f"--batch-size {text!r}: comma-separated integers, e.g. 8,16,32") from None
    if min(sizes) < 1:
        raise InputError(f"--batch-size {text!r}: every batch size must be >= 1")
    return sizes
