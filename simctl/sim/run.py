"""One simulation from names: what `simctl run` does, usable from Python and notebooks too. Every run is a
deployment (`simctl.serving.cluster_config.ClusterConfig`): one replica by default, a cluster of one."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field, replace
from functools import cached_property
from typing import TYPE_CHECKING, Any

import simpy

from simctl.catalogue.gpus import GPUSpec, get_gpu
from simctl.catalogue.models import ModelSpec, get_model, model_in_working_folder
from simctl.catalogue.moe import check_routing_skew
from simctl.common.checks import is_int
from simctl.common.errors import DoesNotFit, InputError
from simctl.common.files import in_working_folder
from simctl.costs.allreduce import check_allreduce
from simctl.costs.base import CostModel
from simctl.costs.kv_capacity import KVSizing, VLLMProfile, kv_capacity_tokens
from simctl.costs.loader import RooflineOptions, check_step_overheads, load_cost
from simctl.costs.pipeline import (
    StagedCost,
    boundary_link,
    check_link,
    check_pp,
    pipeline_kv_tokens,
    staged,
)
from simctl.costs.roofline import Roofline
from simctl.policies.base import Policy, run_stats
from simctl.policies.registry import check_options, make_policy, max_admissible_tokens, policy_class
from simctl.results.cluster_summary import (
    MemberRecords,
    closed_loop_summary,
    iterations_frame,
    summarise_cluster,
)
from simctl.results.run_result import SimResult
from simctl.serving.cluster_config import ClusterConfig
from simctl.serving.front_end import NO_FRONT_END, FrontEnd
from simctl.serving.kv_link import KVLink
from simctl.serving.loop import overload_limit
from simctl.sim.cluster import Cluster, Pool, Progress
from simctl.sim.cluster_run import check_pipelined, make_pool, pipeline_summary, pool_records, stage_backends
from simctl.sim.replica import CostBackend
from simctl.sim.timeline import TimelineBackend, check_timeline
from simctl.traces import has_arrival_times, trace_max_total_tokens
from simctl.traces.request import Request
from simctl.traces.too_long import ERROR, REFUSE, Screened, check_on_too_long, screen
from simctl.traces.workload import MAX_CLOCK_S, Workload

if TYPE_CHECKING:
    import pandas as pd


@dataclass(frozen=True)
class RunConfig:
    policy: str = "sarathi"
    workload: Workload = field(default_factory=Workload)  # the requests and how they arrive
    model: str = "mistral-7b"
    gpu: str = "a100-80gb"
    tp: int = 1
    options: dict[str, Any] = field(default_factory=dict)  # the policy's settings given (its Settings fields)
    fast: bool = True  # advance decode-only stretches in one step (identical results)
    # a fitted cost_model.json, or a cost model built in code (the studies of bench/ and research/); None: the
    # roofline (or, for --gpu cpu, the shipped fit)
    cost: str | CostModel | None = None
    routing_skew: float = 0.0  # an MoE's imbalanced routing for the roofline (catalogue.moe); 0: uniform
    ep: int = 1  # an MoE's experts spread whole over the TP group (the roofline's `ep`); 1: split by TP
    # the server's limits, as vLLM's --max-model-len: positions a request may need (prompt + output; None:
    # the model's context), and what happens to a longer one (refused and counted, an error, its prompt cut)
    max_model_len: int | None = None
    on_too_long: str = REFUSE
    # the server's work per request and per prompt token in front of the engines (serving.front_end)
    front_end_request_s: float = 0.0
    front_end_prompt_token_s: float = 0.0
    # the roofline's all-reduces: NCCL's ring or as vLLM runs them (costs.allreduce); None: the roofline's
    # default (vLLM's), and a fit's own
    allreduce: str | None = None
    # the roofline's step overheads (costs.overheads): its execution mode and host time per step, ms (None:
    # the roofline's defaults, or a given cost model's own)
    execution: str | None = None
    step_overhead_ms: float | None = None
    kv_sizing: KVSizing = field(default_factory=KVSizing)  # memory share, dtypes, a capacity given
    pp: int = 1  # pipeline stages per replica, each on its own TP group (costs.pipeline, serving.pipeline)
    pp_link_gbps: float | None = None  # the stage boundaries' link (None: the GPUs' own interconnect)

    def __post_init__(self) -> None:
        # the user's paths, absolute before a child process (a capacity worker, a Ray task) reads them
        object.__setattr__(self, "workload", self.workload.in_working_folder())
        object.__setattr__(self, "model", model_in_working_folder(self.model))
        if isinstance(self.cost, str) and self.cost.strip():
            object.__setattr__(self, "cost", in_working_folder(self.cost))

    def validate(self) -> None:
        """Check the options that need no catalogue look-up or trace file; raise InputError naming the bad
        value and what is allowed (as the CLI spells the option)."""
        policy_class(self.policy)
        self.workload.validate()
        if not is_int(self.tp) or self.tp < 1:
            raise InputError(f"--tp must be an integer >= 1, got {self.tp!r}")
        check_options(self.policy, self.options)
        check_routing_skew(self.routing_skew)
        check_on_too_long(self.on_too_long)
        if self.max_model_len is not None and (not is_int(self.max_model_len) or self.max_model_len < 2):
            raise InputError(f"--max-model-len must be an integer >= 2, got {self.max_model_len!r}")
        FrontEnd(self.front_end_request_s, self.front_end_prompt_token_s)  # checks its terms
        if self.allreduce is not None:
            check_allreduce(self.allreduce)
        check_step_overheads(self.cost, self.execution, self.step_overhead_ms)
        check_pp(self.pp)
        check_link(self.pp_link_gbps)

    @property
    def roofline_options(self) -> RooflineOptions:
        s = self.kv_sizing  # the roofline's 16-bit model with FP8 weights or KV where given
        ms = self.step_overhead_ms
        return RooflineOptions(self.routing_skew, self.ep, self.allreduce,
                               None if s.dtype == "auto" else s.weight_bytes(2),
                               None if s.kv_cache_dtype == "auto" else s.kv_bytes(2),
                               self.execution, None if ms is None else ms / 1e3)

    @property
    def front_end(self) -> FrontEnd:
        return FrontEnd(self.front_end_request_s, self.front_end_prompt_token_s)

    def with_workload(self, **changes: Any) -> RunConfig:
        """This configuration serving its workload with `changes` (a capacity search's rate, a seed)."""
        return replace(self, workload=replace(self.workload, **changes))

    def recorded(self) -> dict[str, Any]:
        """The settings a summary starts with: all but `fast` and the policy's options (recorded apart), the
        workload's fields among them, and the routing skew, max model length and what happens to a longer
        request only when given (a run without them keeps the summary it had before them)."""
        defaults = {"routing_skew": 0.0, "ep": 1, "max_model_len": None, "on_too_long": REFUSE,
                    "front_end_request_s": 0.0, "front_end_prompt_token_s": 0.0, "allreduce": None,
                    "execution": None, "step_overhead_ms": None, "pp": 1, "pp_link_gbps": None}
        workload = self.workload.recorded()
        head = {"policy": self.policy, "trace": workload.pop("trace"), "model": self.model, "gpu": self.gpu,
                "tp": self.tp, **workload}
        apart = ("workload", "fast", "options", "kv_sizing", *head)
        given = {k: v for k, v in asdict(self).items()
                 if k not in apart and (k not in defaults or v != defaults[k])}
        if isinstance(self.cost, CostModel):  # a cost model built in code: its description
            given["cost"] = repr(self.cost)
        return {**head, **given, **self.kv_sizing.recorded()}


@dataclass
class Run:
    config: RunConfig
    result: SimResult  # the whole deployment's records (every replica's)
    summary: dict[str, Any]
    members: list[MemberRecords]  # each replica's records
    cluster: Cluster  # the pools as the run left them (their policies, KV and records)
    timeline: pd.DataFrame | None = None  # the first iterations' members (run(..., timeline=N))

    # the tables are built when asked for (files, plots): a run that prints its summary imports no pandas
    @cached_property
    def iterations(self) -> pd.DataFrame:
        """Every replica's iteration rows, with pool and replica columns."""
        return iterations_frame(self.members)

    @cached_property
    def replicas(self) -> pd.DataFrame:
        """One row per replica (its metrics)."""
        import pandas as pd

        return pd.DataFrame(self.summary["replica_metrics"])




@dataclass(frozen=True)
class ReplicaHardware:
    """One replica's hardware for a run: the model on its GPU(s), its cost model and KV capacity (sized from
the deployment's memory, weights and TP degree by `costs.kv_capacity`, whatever prices its steps)."""

    model: ModelSpec
    gpu: GPUSpec
    tp: int
    cost: CostModel
    kv_capacity: int  # one policy's: a pipeline-parallel replica's virtual engine holds 1/pp of it
    cost_label: str
    warnings: list[str]
    pp: int = 1
    staged: StagedCost | None = None  # the cost split into stages (pp > 1)

    def check_fits(self, config: RunConfig, requests: list[Request], prefill_only: bool = False) -> int:
        """The max model length (the trace's cap, within the model's context), once every request is checked
        to fit (only its prompt and first token on a prefill-only instance); InputError naming one that does
        not."""
        max_seq_len = min(trace_max_total_tokens(config.workload.trace, requests, config.workload.scale),
                          max_model_len(config, self.model))
        fits = max_admissible_tokens(config.policy, self.kv_capacity, max_seq_len)
        big = max(requests, key=lambda r: r.prompt_tokens + (1 if prefill_only else r.output_tokens))
        output = 1 if prefill_only else big.output_tokens
        need = big.prompt_tokens + output
        if need > fits:
            where = f"{self.model.name} on {self.gpu.name} x{self.tp}"
            if fits == 0:  # a reserving policy: the per-request reservation itself exceeds the cache
                raise DoesNotFit(
                    f"request {big.id} does not fit: {config.policy} reserves the max sequence length "
                    f"({max_seq_len} tokens) of KV cache for every request, but {where} has only "
                    f"{self.kv_capacity} KV slots; use a paged policy (vllm, sarathi), a larger GPU, "
                    "a higher --tp or shorter requests")
            raise DoesNotFit(
                f"request {big.id} does not fit: it needs {need} tokens of KV cache "
                f"({big.prompt_tokens} prompt + {output} output) but {config.policy} can hold at most {fits} "
                f"for one request on {where} ({self.kv_capacity} KV slots); use a larger GPU, a higher --tp "
                "or shorter requests")
        return max_seq_len


def deploy(config: RunConfig, gpu_name: str, tp: int) -> ReplicaHardware:
    """A replica of `tp` GPUs named `gpu_name` for `config`'s model and cost model."""
    model, gpu = get_model(config.model), get_gpu(gpu_name)
    pp = check_pp(config.pp, model)
    loaded = load_cost(config.cost, model, gpu, tp, config.roofline_options)
    cost = loaded.cost
    if pp > 1:
        kv = pipeline_kv_tokens(model, gpu, tp, pp, loaded.dtype_bytes, loaded.memory_bytes, config.kv_sizing)
        link = boundary_link(cost if isinstance(cost, Roofline) else Roofline(model, gpu, tp=tp),
                             config.pp_link_gbps)
        return ReplicaHardware(model, gpu, tp, cost, kv // pp, loaded.label, loaded.warnings, pp,
                          staged(cost, model, link, pp))
    # on a GPU, vllm-v1's cache as vLLM sizes it (vLLM's CPU backend takes a KV size given instead)
    policy = policy_class(config.policy)
    profiled = None if gpu.name == "cpu" else policy.memory_profile(config.options, gpu.name)
    kv = kv_capacity_tokens(model, gpu, tp, loaded.dtype_bytes, loaded.memory_bytes, config.kv_sizing,
                            VLLMProfile(*profiled) if profiled else None)
    return ReplicaHardware(model, gpu, tp, cost, kv, loaded.label, loaded.warnings)


def _deploy_pool(config: RunConfig, cc: ClusterConfig, pool: str) -> ReplicaHardware:
    """A pool's replica: its own GPU and TP degree where given (--prefill-gpu/-tp, --decode-gpu/-tp), else the
    run's; a TP degree the model or cost model refuses is named by the option that gave it."""
    gpu = {"prefill": cc.prefill_gpu, "decode": cc.decode_gpu}.get(pool) or config.gpu
    tp = cc.pool_tp(pool, config.tp)
    try:
        return deploy(config, gpu, tp)
    except InputError as e:
        if tp == config.tp:
            raise
        raise InputError(f"--{pool}-tp {tp}: {e}") from None


def check_fit(config: RunConfig, cluster: ClusterConfig) -> None:
    """Size each pool's replicas and check the trace's requests against them as a run would, without running:
    `DoesNotFit` where the model does not fit its GPUs' memory, or a request their KV cache."""
    config.validate()
    requests = trace_for(config).requests
    if cluster.disaggregated:
        _deploy_pool(config, cluster, "prefill").check_fits(config, requests, prefill_only=True)
    serving = _deploy_pool(config, cluster, "decode" if cluster.disaggregated else "replicas")
    serving.check_fits(config, requests)


def max_model_len(config: RunConfig, model: ModelSpec) -> int:
    """The positions a request may need: --max-model-len, within the model's context (its default)."""
    if config.max_model_len is None:
        return model.max_position
    if config.max_model_len > model.max_position:
        raise InputError(f"--max-model-len {config.max_model_len} exceeds {model.name}'s context of "
                         f"{model.max_position} positions")
    return config.max_model_len


def trace_for(config: RunConfig) -> Screened:
    """The run's requests (of a validated `config`), those longer than the max model length refused or
    truncated (`on_too_long`), checked against the simulated clock."""
    model = get_model(config.model)
    requests = config.workload.requests()
    limit = max_model_len(config, model)
    if config.on_too_long == ERROR and config.max_model_len is None:
        model.check_context(requests, config.workload.scale)  # the catalogue's words: the model's context
    screened = screen(requests, limit, config.on_too_long)
    requests = screened.requests
    last = requests[-1].arrival_s
    if last > MAX_CLOCK_S:
        raise InputError(f"request {requests[-1].id} arrives at {last:.6g} s, beyond the simulated clock's "
                         f"{MAX_CLOCK_S:.0e} s (raise --qps, or check that the trace file's arrival times "
                         "are in seconds)")
    return screened


def run(config: RunConfig, cluster: ClusterConfig | None = None, progress: Progress | None = None,
        timeline: int = 0) -> Run:
    """Simulate `config` on the deployment `cluster` describes (one replica if None); with `timeline` > 0
    (one replica), also record which requests the first `timeline` iterations ran."""
    cc = cluster or ClusterConfig()
    config.validate()
    cc.validate(config.policy)
    check_timeline(timeline)
    if timeline and cc.is_cluster:
        raise InputError("--timeline records one replica; it is not available with a cluster")
    check_pipelined(config.pp, cc, timeline)
    entry = _deploy_pool(config, cc, "prefill") if cc.disaggregated else None
    serving = _deploy_pool(config, cc, "decode" if cc.disaggregated else "replicas")
    screened = trace_for(config)
    requests = screened.requests
    recorder = TimelineBackend(serving.cost, config.fast, timeline) if timeline else None
    built = Cluster(simpy.Environment(), KVLink(cc.kv_link_gbps) if cc.disaggregated else None,
                    serving.model.kv_bytes_per_token())
    limit = overload_limit([r.arrival_s for r in requests])
    if entry is not None:
        built.entry = _pool("prefill", cc.prefill_instances, entry,
                            entry.check_fits(config, requests, prefill_only=True), config, cc, built, limit)
        built.decode = _pool("decode", cc.decode_instances, serving, serving.check_fits(config, requests),
                             config, cc, built, limit)
    else:
        built.entry = _pool("replicas", cc.replicas, serving, serving.check_fits(config, requests), config,
                            cc, built, limit, recorder)
    t0 = time.perf_counter()
    seqs = built.run(requests, progress, config.workload.concurrency, config.workload.think_time)
    wall_s = time.perf_counter() - t0
    members = [r for p in _pools(built) for r in pool_records(p)]
    head = {**config.recorded(), **cc.recorded(config.tp)}
    policies = [m.policy for m in built.members]
    result, summary = summarise_cluster(head, members, seqs, built.link, built.aborted,
                                        built.members[-1].policy.kv.capacity, wall_s)
    # replayed (qps None) or time-scaled
    summary["arrivals_from_file"] = has_arrival_times(config.workload.trace)
    summary["cost_model"] = serving.cost_label
    summary["cost_assumptions"] = serving.cost.assumptions()
    summary["warnings"] = list(dict.fromkeys(w for d in (entry, serving) if d is not None
                                             for w in d.warnings))
    _note_too_long(summary, screened, max_model_len(config, serving.model))
    if config.front_end.modelled:  # a run without one keeps the summary it had before
        summary["ttft_from"] = "send"  # the client's: the front end's time is in TTFT and E2E
    if built.closed is not None:
        summary.update(closed_loop_summary(result.request_columns, summary["makespan_s"]))
    summary.update(policies[0].settings.as_dict())  # every setting of the policy, given or default
    summary.update(run_stats(policies))  # what the policies counted (vllm-v1: prefix-cache hits), if anything
    if serving.pp > 1:
        summary["pipeline"] = pipeline_summary(built.entry, summary["makespan_s"])
    return Run(config, result, summary, members, built, recorder.frame() if recorder else None)


def _note_too_long(summary: dict[str, Any], screened: Screened, limit: int) -> None:
    """`rejected` and `truncated` in the summary (and a warning) when some request exceeded the max model
    length; a run whose requests all fit keeps the summary it had before."""
    note = screened.note(limit)
    if note is None:
        return
    summary["max_model_len"] = limit
    summary["rejected"] = screened.refused
    summary["truncated"] = screened.truncated
    summary["longest_rejected_positions"] = screened.longest
    summary["warnings"].append(note)


def _pool(name: str, count: int, d: ReplicaHardware, max_seq_len: int, config: RunConfig, cc: ClusterConfig,
          cluster: Cluster, limit: int, recorder: TimelineBackend | None = None) -> Pool:
    def new_policy() -> Policy:
        return make_policy(config.policy, d.kv_capacity, max_seq_len, config.options, d.gpu.name)

    new_backend = (stage_backends(d.cost, d.staged) if d.staged is not None
                   else lambda: recorder or CostBackend(d.cost, config.fast))
    front_end = config.front_end if name in ("replicas", "prefill") else NO_FRONT_END
    return make_pool(name, count, d.gpu.name, new_backend, new_policy, cc.router, cluster, limit, d.tp,
                     cc.router_settings(), cc.router_lag or 0.0, front_end, d.pp)


def _pools(cluster: Cluster) -> list[Pool]:
    return [cluster.entry] if cluster.decode is None else [cluster.entry, cluster.decode]
