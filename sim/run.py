"""One simulation from names: what `simctl run` does, usable from Python and notebooks too."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from policies.registry import POLICIES, make_policy, max_admissible_tokens
from sim.cost.roofline import Roofline
from sim.gpus import get_gpu
from sim.metrics import summarize
from sim.models import get_model
from sim.simulate import SimResult, simulate
from simctl.errors import InputError
from traces import build_trace, trace_max_total_tokens


@dataclass(frozen=True)
class RunConfig:
    policy: str = "sarathi"
    trace: str = "arxiv"  # a length profile name or a trace file
    model: str = "mistral-7b"
    gpu: str = "a100-80gb"
    tp: int = 1
    qps: float = 0.5
    num_requests: int = 1000
    seed: int = 0
    token_budget: int | None = None  # Sarathi-Serve only
    max_batch_size: int | None = None
    arrival: str = "poisson"
    cv: float = 1.0  # burstiness of gamma arrivals
    fast: bool = True  # advance decode-only stretches in one step (identical results)

    def validate(self) -> None:
        if self.policy not in POLICIES:
            raise InputError(f"unknown policy {self.policy!r}; known: {', '.join(POLICIES)}")
        if self.tp < 1:
            raise InputError(f"--tp must be >= 1, got {self.tp}")
        if not (self.qps > 0 and math.isfinite(self.qps)):
            raise InputError(f"--qps must be a positive number, got {self.qps}")
        if self.num_requests < 1:
            raise InputError(f"--num-requests must be >= 1, got {self.num_requests}")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise InputError(f"--max-batch-size must be >= 1, got {self.max_batch_size}")
        if self.token_budget is not None:
            if not self.policy.startswith("sarathi"):
                raise InputError(f"--token-budget applies to the sarathi policies, not {self.policy!r}")
            if self.token_budget < 1:
                raise InputError(f"--token-budget must be >= 1, got {self.token_budget}")


@dataclass
class Run:
    config: RunConfig
    result: SimResult
    summary: dict[str, Any]


def run(config: RunConfig) -> Run:
    config.validate()
    model, gpu = get_model(config.model), get_gpu(config.gpu)
    cost = Roofline(model, gpu, tp=config.tp)
    kv_capacity = cost.kv_capacity_tokens()
    requests = build_trace(config.trace, config.num_requests, config.qps, config.seed,
                           arrival=config.arrival, cv=config.cv)
    max_seq_len = trace_max_total_tokens(config.trace, requests)
    fits = max_admissible_tokens(config.policy, kv_capacity, max_seq_len)
    big = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
    if big.prompt_tokens + big.output_tokens > fits:
        raise InputError(
            f"request {big.id} needs {big.prompt_tokens + big.output_tokens} tokens of KV but {config.policy} "
            f"can give one request at most {fits} on {gpu.name} x{config.tp} ({kv_capacity} slots in all)")
    policy = make_policy(config.policy, kv_capacity, max_seq_len, config.max_batch_size, config.token_budget)
    result = simulate(requests, policy, cost, fast=config.fast, max_waiting=max(1000, config.num_requests // 2))
    summary = {**{k: v for k, v in asdict(config).items() if k != "fast"}, **summarize(result)}
    summary["max_batch_size"] = policy.max_batch_size
    if hasattr(policy, "token_budget"):
        summary["token_budget"] = policy.token_budget
    return Run(config, result, summary)
