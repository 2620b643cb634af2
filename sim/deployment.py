"""One replica's deployment for a run: the trace it serves and the hardware it runs on (cost model, KV
capacity, max model length), checked to hold every request. `sim.run` and the cluster (`sim.cluster_run`)
build every replica from these."""

from __future__ import annotations

from dataclasses import dataclass

from common.errors import InputError
from policies.registry import max_admissible_tokens
from sim.cost.base import CostModel
from sim.gpus import get_gpu
from sim.models import get_model
from sim.run import MAX_CLOCK_S, RunConfig, cost_model
from traces import build_trace, trace_max_total_tokens
from traces.request import Request


@dataclass(frozen=True)
class Deployment:
    """One replica's hardware for a run: its cost model, KV capacity and max model length."""

    cost: CostModel
    kv_capacity: int
    cost_label: str
    warnings: list[str]
    max_seq_len: int


def deploy(config: RunConfig, gpu_name: str, requests: list[Request], prefill_only: bool = False) -> Deployment:
    """The deployment of `config.model` on `gpu_name`, checked to hold every request (only its prompt and first
    token for a prefill-only instance); InputError naming the request that does not fit."""
    model, gpu = get_model(config.model), get_gpu(gpu_name)
    cost, kv_capacity, cost_label, warnings = cost_model(config.cost, model, gpu, config.tp)
    # a deployment's max model length: the trace's cap, within the model's context
    max_seq_len = min(trace_max_total_tokens(config.trace, requests, config.scale), model.max_position)
    fits = max_admissible_tokens(config.policy, kv_capacity, max_seq_len)
    big = max(requests, key=lambda r: r.prompt_tokens + (1 if prefill_only else r.output_tokens))
    output = 1 if prefill_only else big.output_tokens
    need = big.prompt_tokens + output
    if need > fits:
        where = f"{model.name} on {gpu.name} x{config.tp}"
        if fits == 0:  # a reserving policy: the per-request reservation itself exceeds the cache
            raise InputError(
                f"request {big.id} does not fit: {config.policy} reserves the max sequence length "
                f"({max_seq_len} tokens) of KV cache for every request, but {where} has only {kv_capacity} KV "
                "slots; use a paged policy (vllm, sarathi), a larger GPU, a higher --tp or shorter requests")
        raise InputError(
            f"request {big.id} does not fit: it needs {need} tokens of KV cache ({big.prompt_tokens} prompt + "
            f"{output} output) but {config.policy} can hold at most {fits} for one request on "
            f"{where} ({kv_capacity} KV slots); use a larger GPU, a higher --tp or shorter requests")
    return Deployment(cost, kv_capacity, cost_label, warnings, max_seq_len)


def trace_for(config: RunConfig) -> list[Request]:
    """The run's requests, checked against the model's context and the simulated clock."""
    config.validate()
    requests = build_trace(config.trace, config.num_requests, config.qps, config.seed,
                           arrival=config.arrival, cv=config.cv, scale=config.scale)
    get_model(config.model).check_context(requests, config.scale)
    last = requests[-1].arrival_s
    if last > MAX_CLOCK_S:
        raise InputError(f"request {requests[-1].id} arrives at {last:.6g} s, beyond the simulated clock's "
                         f"{MAX_CLOCK_S:.0e} s (raise --qps, or check that the trace file's arrival times "
                         "are in seconds)")
    return requests
