"""Comma lists on the command line, compared in one table: `--policy`, `--model`, `--gpu`, `--tp` and every
policy setting take a list in `capacity` and `run`, and each combination is one configuration, as in a sweep
file's grid (a setting applies to the listed policies that take it; one that no listed policy takes is
refused, in one line)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from typing import Any

from simctl.common.errors import InputError
from simctl.configs import Deployment, Execution, Workload
from simctl.costs.kv_capacity import KVSizing
from simctl.options import comma_list, policy_list
from simctl.policies.registry import check_options, policy_class
from simctl.sim.run import RunConfig


@dataclass(frozen=True)
class Combination:
    config: RunConfig
    label: str  # the policy and the values that vary across the lists, e.g. "sarathi token_budget=512"


def int_list(text: str, flag: str) -> list[int]:
    try:
        return [int(t) for t in comma_list(str(text), flag)]
    except ValueError:
        raise InputError(f"--{flag} {text!r}: comma-separated integers, e.g. 1,2") from None


def _known(models: list[str], gpus: list[str]) -> None:
    """An unknown model or GPU in a list is refused before anything runs."""
    from simctl.catalogue.gpus import get_gpu
    from simctl.catalogue.models import get_model

    for m in models:
        get_model(m)
    for g in gpus:
        get_gpu(g)


def _settings(policy: str, options: dict[str, list[Any] | None]) -> list[dict[str, Any]]:
    """Every combination of the settings `policy` takes (one, of its defaults, when it takes none given)."""
    fields = policy_class(policy).Settings.__dataclass_fields__
    taken = {k: v for k, v in options.items() if v is not None and k in fields}
    return [dict(zip(taken, values)) for values in itertools.product(*taken.values())]


def base_config(workload: Workload, deployment: Deployment, execution: Execution = Execution()
                ) -> RunConfig:
    """The run configuration the sections give (the workload's defaults resolved), before the comma lists
    are expanded."""
    return RunConfig(workload=workload, cost=deployment.cost, routing_skew=deployment.routing_skew,
                     ep=deployment.ep,
                     max_model_len=deployment.max_model_len, on_too_long=deployment.on_too_long,
                     front_end_request_s=deployment.front_end_request_s,
                     front_end_prompt_token_s=deployment.front_end_prompt_token_s,
                     allreduce=deployment.allreduce, execution=execution.execution,
                     step_overhead_ms=execution.step_overhead_ms, kv_sizing=KVSizing(
                         deployment.gpu_memory_utilization, deployment.dtype, deployment.kv_cache_dtype,
                         deployment.kv_cache_tokens, deployment.num_gpu_blocks_override),
                     pp=deployment.pp, pp_link_gbps=deployment.pp_link_gbps)


def grid(base: RunConfig, policy: str, deployment: Deployment,
         options: dict[str, list[Any] | None]) -> list[Combination]:
    """One configuration per combination of the values listed, named by the policy and what varies."""
    policies = policy_list(policy)
    models, gpus = comma_list(deployment.model, "model"), comma_list(deployment.gpu, "gpu")
    tps = int_list(deployment.tp, "tp")
    _known(models, gpus)
    given = {k: v for k, v in options.items() if v is not None}
    for name, values in given.items():  # a setting no listed policy takes: the registry's one line
        if not any(name in policy_class(p).Settings.__dataclass_fields__ for p in policies):
            check_options(policies[0], {name: values[0]})
    varies = {"model": len(models) > 1, "gpu": len(gpus) > 1, "tp": len(tps) > 1,
              **{k: len(v) > 1 for k, v in given.items()}}
    out = []
    for p, m, g, t in itertools.product(policies, models, gpus, tps):
        for settings in _settings(p, options):
            named = {"model": m, "gpu": g, "tp": t, **settings}
            label = " ".join([p, *(f"{k}={v}" for k, v in named.items() if varies.get(k))])
            config = replace(base, policy=p, model=m, gpu=g, tp=t, options=settings)
            out.append(Combination(config, label))
    return out
