"""The simulator's twin of a real run: the setup every run of a validation shares, the summary a real run at a
rate would record (its requests and KV sizing) without running it, the same requests and policy rebuilt from
a run's summary (`twin_inputs`), its simulation, and the cost model it is priced with."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from simctl.executor.config import DEFAULT_CONFIG, ExecutorConfig, check_same
from simctl.policies.base import Policy
from simctl.policies.registry import make_policy, policy_class
from simctl.serving.loop import overload_limit
from simctl.traces.request import Request
from simctl.traces.workload import Workload

if TYPE_CHECKING:
    from simctl.costs.base import CostModel
    from simctl.engine.setup import RealConfig
    from simctl.results.run_result import SimResult

DEFAULT_LINK_GBPS = 1.0  # this VM's shared-memory hand-over, measured: 0.7-2.7 Gbit/s effective per transfer
DEFAULT_NUM_REQUESTS = 300  # fewer, and the default SLO never binds (`simctl.validation.validate`)
# sharegpt x 0.05: median prompt ~80 tokens, output ~20; a real run takes ~10-30 s here (rate: each load's)
DEFAULT_WORKLOAD = Workload(trace="sharegpt", qps=None, num_requests=DEFAULT_NUM_REQUESTS, scale=0.05)


@dataclass(frozen=True)
class Setup:
    """What every run of one validation shares (the real runs' options)."""

    workload: Workload = field(default=DEFAULT_WORKLOAD)  # its rate (qps) is each run's
    model: str = "tiny"
    threads: int | None = None
    dtype: str = "float32"
    device: str = "cpu"
    kv_budget_bytes: int | None = None  # the KV slab budget of every run (None: the CPU's); probed on cuda
    attention: str = "auto"  # the runs' SDPA kernels (simctl.executor.config.ATTENTION)
    eager: bool = True  # False: the runs' decode steps replay CUDA graphs
    prefill_instances: int | None = None  # both 1: real disaggregated runs (engine.disagg), a cluster twin
    decode_instances: int | None = None
    kv_link_gbps: float = DEFAULT_LINK_GBPS  # the twin's link before a real run has measured one

    def recorded(self) -> dict[str, Any]:
        """Its fields for validation.json's `config`, the workload's among them (as a run's summary)."""
        return {**self.workload.recorded(), **{k: v for k, v in asdict(self).items() if k != "workload"}}

    def real_config(self, policy: str, qps: float | None) -> RealConfig:
        """The real run of `policy` at `qps` (None: closed-loop clients without a rate)."""
        from simctl.engine.real import RealConfig

        return RealConfig(policy=policy, workload=self.workload.at(qps), model=self.model, device=self.device,
                          dtype=self.dtype,
                          threads=self.threads, kv_budget_bytes=self.kv_budget_bytes,
                          attention=self.attention, eager=self.eager,
                          prefill_instances=self.prefill_instances, decode_instances=self.decode_instances)



def twin_summary(setup: Setup, policy: str, qps: float | None) -> dict[str, Any]:
    """The summary fields `twin_inputs` reads, as a real run of `policy` at `qps` would record
    them (its requests and its KV sizing on the setup's budget), without running it."""
    from simctl.catalogue.models import get_model
    from simctl.catalogue.recorded_model import dtype_bytes_of
    from simctl.engine.real import CPU_KV_BYTES
    from simctl.engine.setup import size_run, sized_policy
    config = setup.real_config(policy, qps)
    requests = config.workload.requests()
    spec = get_model(config.model)
    if setup.kv_budget_bytes is None and setup.device != "cpu":
        raise ValueError("a cuda setup sizes its runs on the budget simctl.engine.real.probe_device measured")
    budget = CPU_KV_BYTES if setup.kv_budget_bytes is None else setup.kv_budget_bytes
    size = size_run(config, requests, spec.kv_bytes_per_token(dtype_bytes_of(config.dtype)), budget)
    probe = sized_policy(config, size)
    summary = {**config.recorded(), "kv_capacity_tokens": size.kv_capacity, "max_seq_len": size.max_seq_len,
               "executor_config": config.executor.record(config.device), **probe.settings.as_dict()}
    if config.disaggregated:
        summary["kv_link"] = {"gbps": setup.kv_link_gbps}
    return summary



def twin_inputs(summary: dict[str, Any]) -> tuple[list[Request], Policy]:
    """The Request list a real run served and a fresh policy configured as it was (`twin_policy`), from the
    run's summary: `simctl.sim.simulate.simulate(requests, policy, cost)` then predicts the same run."""
    return Workload.of_record(summary).requests(), twin_policy(summary)


def twin_policy(summary: dict[str, Any]) -> Policy:
    """A fresh policy configured as the real run's was (KV capacity, max_seq_len, every policy setting)."""
    settings = policy_class(summary["policy"]).Settings.__dataclass_fields__
    return make_policy(summary["policy"], summary["kv_capacity_tokens"], summary["max_seq_len"],
                       {k: summary[k] for k in settings if k in summary})


def vllm_twin(settings: dict[str, Any], kv_capacity: int | None = None) -> Policy:
    """`vllm-v1` configured as a started vLLM resolved its settings (`engine.vllm_real.VLLMServer.settings`),
    on the KV blocks its requests can hold (`kv_cache_tokens`; or `kv_capacity` tokens)."""
    kv = settings["kv_cache_tokens"] if kv_capacity is None else kv_capacity
    return twin_policy({**settings, "kv_capacity_tokens": kv, "max_seq_len": settings["max_model_len"]})


def fitted_executor(cost: CostModel) -> ExecutorConfig:
    """The executor configuration a fitted `cost` was profiled with (the default for a cost model without a
    profile)."""
    meta = getattr(cost, "meta", None)
    return ExecutorConfig.of_record(meta) if meta else DEFAULT_CONFIG


def check_executor(cost: CostModel, run: dict[str, Any]) -> None:
    """InputError when `run` (a real run's summary, or `twin_summary`'s) was made with another executor
    configuration than the fitted `cost` was profiled with: its times are another executor's."""
    meta = getattr(cost, "meta", None)
    if meta:
        check_same(meta, run)


def simulate_twin(summary: dict[str, Any], cost: CostModel) -> tuple[dict[str, Any], SimResult]:
    """The simulator's prediction of the run `summary` describes (a real run's, or `twin_summary`'s):
    (its summary, its SimResult)."""
    from simctl.catalogue.recorded_model import dtype_bytes_of
    from simctl.results.metrics import summarise_result
    from simctl.sim.simulate import simulate

    check_executor(cost, summary)
    requests, policy = twin_inputs(summary)
    keep = ("policy", "trace", "model", "qps", "scale", "seed", "arrival", "cv", "max_seq_len")
    head = {"mode": "sim", **{k: summary.get(k) for k in keep}, **policy.settings.as_dict()}
    # a disaggregated run: the cluster, its link as the real one measured
    if summary.get("prefill_instances"):
        from simctl.catalogue.models import get_model
        from simctl.sim.cluster_run import simulate_disaggregated

        spec = get_model(summary["model"])
        result, s = simulate_disaggregated(requests, lambda: twin_policy(summary), cost,
                                           summary.get("kv_link", {}).get("gbps", DEFAULT_LINK_GBPS),
                                           spec.kv_bytes_per_token(dtype_bytes_of(summary["dtype"])), head)
        return s, result
    result = simulate(requests, policy, cost, max_waiting=overload_limit([r.arrival_s for r in requests]),
                      concurrency=summary.get("concurrency"), think_s=summary.get("think_time", 0.0))
    return {**head, **summarise_result(result)}, result


def cost_name(cost: Any) -> str:
    from simctl.costs.base import CostModel

    return repr(cost) if isinstance(cost, CostModel) else str(cost)



def cost_meta(cost: Any) -> dict[str, Any]:
    meta = getattr(cost, "meta", None) or {}
    return {k: meta.get(k) for k in ("device", "device_name", "dtype", "threads", "date", "grid")}

