"""A real run's configuration (`RealConfig`), the sizing of its KV slab (`size_run`) and the construction of
its engine (`build_engine`): shared by the single-engine run (`simctl.engine.real`) and the two engines of a
disaggregated one (`simctl.engine.disagg`).

Sizing (`size_run`): lengths are the trace's times `scale` (rounded, at least 1). `max_seq_len` = the
longest scaled request rounded up to 16 (what Orca/FasterTransformer reserve and vLLM's per-iteration cap);
the slab has `kv_slots` = min(requests, max batch size) rows of `kv_slot_tokens` = max_seq_len positions
(FasterTransformer: longest prompt + longest output, since its padded decodes read that many columns; Baton:
the whole KV capacity, kv_slots x max_seq_len, since its batch's rows widen with placeholder columns).
Enough: every policy here admits a new request only from the head of its waiting queue, where preempted
requests return, so requests holding a slot (running or preempted) never outnumber the max batch size. The KV
capacity handed to the policy is `kv_slots x max_seq_len` unless given. If the slab would exceed the memory
budget (CPU: 1 GiB; cuda: half the free memory after the weights; or `kv_budget_bytes` given), fewer slots are
used and the policy's max batch size is lowered to match (recorded as `max_batch_size`, with
`max_batch_size_capped: true`). `probe_device` measures a device's budget in a child, as a run would: `simctl
validate` hands it to every real run and sizes their twins with it, so sizing does not drift with the free
memory between runs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from simctl.catalogue.models import model_in_working_folder
from simctl.common.checks import is_int
from simctl.common.errors import InputError
from simctl.executor.config import ExecutorConfig
from simctl.policies.base import Policy
from simctl.policies.registry import check_options, make_policy, max_admissible_tokens, policy_class
from simctl.traces.build import aligned
from simctl.traces.request import Request
from simctl.traces.workload import Workload

if TYPE_CHECKING:
    import pandas as pd
    import torch

    from simctl.engine.serve import Engine, EngineResult
    from simctl.results.run_result import SimResult

DEFAULT_NUM_REQUESTS = 100  # for a length profile when none is given (a trace file: every row)
DEFAULT_QPS = 1.0  # for generated arrivals when none is given
# what `real_main` serves unless given: the rate and count above (a trace file: its own arrival times, all
# its rows)
REAL_WORKLOAD = Workload(trace="sharegpt", qps=None, num_requests=None)


@dataclass(frozen=True)
class RealConfig:
    policy: str = "sarathi"
    # the requests and how they arrive; its seed also draws the prompt ids and the model's weights
    workload: Workload = field(default_factory=lambda: Workload(trace="sharegpt", qps=DEFAULT_QPS,
                                                                num_requests=DEFAULT_NUM_REQUESTS))
    model: str = "tiny"
    device: str = "cpu"
    dtype: str = "float32"
    threads: int | None = None  # CPU threads [default: every core, simctl.executor.runtime.default_threads]
    options: dict[str, Any] = field(default_factory=dict)  # the policy's settings given (its Settings fields)
    kv_capacity: int | None = None  # KV token slots the policy may use [default: kv_slots x max_seq_len]
    kv_budget_bytes: int | None = None  # the KV slab's memory budget [default: device_kv_budget]
    attention: str = "auto"  # SDPA kernels (simctl.executor.config.ATTENTION)
    eager: bool = True  # False: decode steps replay CUDA graphs (simctl.executor.cuda_graphs)
    prefill_instances: int | None = None  # both 1: disaggregated prefill and decode (simctl.engine.disagg)
    decode_instances: int | None = None

    def __post_init__(self) -> None:
        # the user's paths, absolute before the serving child (and a prefill instance's own child) reads them
        object.__setattr__(self, "workload", self.workload.in_working_folder())
        object.__setattr__(self, "model", model_in_working_folder(self.model))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> RealConfig:
        """A configuration from its `asdict` (the serving child reads it so)."""
        return cls(**{**d, "workload": Workload(**d["workload"])})

    def recorded(self) -> dict[str, Any]:
        """The settings a summary starts with: every field but the policy's options (recorded apart), the
        workload's among them."""
        return {"policy": self.policy, **self.workload.recorded(),
                **{k: v for k, v in asdict(self).items() if k not in ("policy", "workload", "options")}}

    @property
    def disaggregated(self) -> bool:
        return self.prefill_instances is not None or self.decode_instances is not None

    @property
    def executor(self) -> ExecutorConfig:
        """The run's executor configuration (a fit prices only runs made with the one it was profiled
        with)."""
        return ExecutorConfig(attention=self.attention, eager=self.eager)

    def validate(self) -> None:
        """Check every option that needs neither torch nor the trace's lengths (InputError, as the CLI
        spells the option)."""
        from simctl.catalogue.models import get_model
        from simctl.executor.model import DEVICES, DTYPES

        policy_class(self.policy)
        self.workload.validate()
        check_options(self.policy, self.options)
        spec = get_model(self.model)
        if spec.mlp != "gated":
            raise InputError(f"--model {spec.name}: only gated (SwiGLU, Llama-style) shapes can be built "
                             "for real execution")
        dev = str(self.device).lower()
        if dev not in DEVICES and not dev.startswith("cuda:"):
            raise InputError(f"--device {self.device!r} not supported; choose cpu or cuda")
        if self.dtype not in DTYPES:
            raise InputError(f"--dtype {self.dtype!r} not supported; choose one of {', '.join(DTYPES)}")
        self.executor.validate(self.device)
        if self.threads is not None and (not is_int(self.threads) or self.threads < 1):
            raise InputError(f"--threads must be an integer >= 1, got {self.threads!r}")
        if self.kv_capacity is not None and (not is_int(self.kv_capacity) or self.kv_capacity < 1):
            raise InputError(f"--kv-capacity must be an integer >= 1 (token slots), got {self.kv_capacity!r}")
        if self.kv_budget_bytes is not None and (not is_int(self.kv_budget_bytes)
                                                 or self.kv_budget_bytes < 1):
            raise InputError(f"kv_budget_bytes must be an integer >= 1, got {self.kv_budget_bytes!r}")
        if self.disaggregated:
            self._check_disaggregated()

    def _check_disaggregated(self) -> None:
        from simctl.serving.cluster_config import check_disaggregable, check_instances

        check_instances(prefill_instances=self.prefill_instances, decode_instances=self.decode_instances)
        if (self.prefill_instances, self.decode_instances) != (1, 1):
            raise InputError("real disaggregated serving runs one prefill and one decode instance "
                             "(--prefill-instances 1 --decode-instances 1): each is a process with its own "
                             "model")
        if str(self.device).lower() != "cpu":
            raise InputError("real disaggregated serving runs on the CPU (--device cpu): its two instances "
                             "would share one GPU")
        if self.workload.concurrency is not None:
            raise InputError("--concurrency: real disaggregated serving replays arrivals open loop (its "
                             "prefill instance takes them ahead); closed-loop clients drive a lone engine")
        check_disaggregable(self.policy)


@dataclass(frozen=True)
class Sizing:
    max_seq_len: int
    kv_slots: int
    kv_slot_tokens: int
    kv_capacity: int
    max_batch_size: int
    max_batch_size_capped: bool



def sized_policy(config: RealConfig, size: Sizing) -> Policy:
    """The policy of a real run, on its KV capacity and with its (possibly capped) batch size."""
    return make_policy(config.policy, size.kv_capacity, size.max_seq_len,
                       {**config.options, "max_batch_size": size.max_batch_size})


def size_run(config: RealConfig, requests: list[Request], kv_bytes_per_token: int,
             budget_bytes: int) -> Sizing:
    """Slab shape, KV capacity and batch size of a run (see the module docstring); InputError if a request
    cannot run."""
    from simctl.catalogue.models import get_model

    spec = get_model(config.model)
    longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
    need = longest.prompt_tokens + longest.output_tokens
    max_seq_len = aligned(need)
    spec.check_context(requests, config.workload.scale)
    max_seq_len = min(max_seq_len, spec.max_position)
    slot_tokens = max_seq_len
    if policy_class(config.policy).padded_batches:  # padded decodes read prompt-pad + steps columns
        wide = max(r.prompt_tokens for r in requests) + max(r.output_tokens for r in requests)
        slot_tokens = max(slot_tokens, aligned(wide))
    probe = make_policy(config.policy, max_seq_len, max_seq_len, config.options)
    if probe.shares_prefixes and any(r.prefix_group >= 0 or r.hash_ids or r.session >= 0 for r in requests):
        raise InputError(f"{config.policy} reuses cached prompt prefixes across requests, which this engine "
                         "cannot (each request's KV lives in its own slot): give --enable-prefix-caching 0, "
                         "or a trace without shared prefixes (prefix_group, Mooncake hash_ids, sessions)")
    if probe.concurrent_streams:
        raise InputError(f"{config.policy}: this engine runs one stream, not a prefill beside the decode: "
                         "give --overlap 0")
    batch = probe.max_batch_size
    slots = min(len(requests), batch)
    capped = False
    if policy_class(config.policy).widening_kv:  # Baton: a row may read up to the whole capacity's width,
        # so slots^2 x max_seq_len
        fit = max(1, math.isqrt(budget_bytes // (max_seq_len * kv_bytes_per_token)))
        if fit < slots:
            slots, batch, capped = fit, fit, True
        slot_tokens = slots * max_seq_len
    fit = budget_bytes // (slot_tokens * kv_bytes_per_token)
    if fit < slots:
        if fit < 1:
            raise InputError(f"one KV slot of {slot_tokens} tokens ({slot_tokens * kv_bytes_per_token} "
                             f"bytes) exceeds the memory budget of {budget_bytes} bytes; lower --scale")
        slots, batch, capped = fit, fit, True
    capacity = slots * max_seq_len if config.kv_capacity is None else int(config.kv_capacity)
    if policy_class(config.policy).widening_kv and capacity > slot_tokens:
        raise InputError(f"--kv-capacity {capacity}: {config.policy}'s batch may widen to its whole KV "
                         f"capacity, but the slab holds {slot_tokens} positions per row; give at most "
                         f"{slot_tokens}")
    fits = max_admissible_tokens(config.policy, capacity, max_seq_len)
    if need > fits:
        raise InputError(f"request {longest.id} needs {need} tokens of KV cache but {config.policy} can hold "
                         f"at most {fits} for one request with {capacity} KV slots; raise --kv-capacity")
    return Sizing(max_seq_len, slots, slot_tokens, capacity, batch, capped)


@dataclass
class RealRun:
    config: RealConfig
    requests: list[Request]  # exactly what was served (scaled lengths, arrivals in seconds from the start)
    summary: dict[str, Any]
    result: SimResult  # the records in the simulator's form
    engine: EngineResult  # tokens, per-iteration forward times
    iterations: pd.DataFrame  # iteration rows with pool and replica columns
    replicas: pd.DataFrame  # one row per instance


def build_engine(config: RealConfig, requests: list[Request], size: Sizing, model: torch.nn.Module
                 ) -> tuple[Engine, float]:
    """The engine of a run on a built `model`: its slab, policy and prompts, warmed up (and the seconds that
    took)."""
    from simctl.catalogue.models import get_model
    from simctl.engine.serve import Engine, prompt_ids, warm_up
    from simctl.executor.ragged import RaggedExecutor

    vocab = get_model(config.model).vocab_size
    executor = RaggedExecutor(model, size.kv_slots, size.kv_slot_tokens, config.executor)
    policy = sized_policy(config, size)
    seed = config.workload.seed
    prompts = {r.id: prompt_ids(r.id, r.prompt_tokens, vocab, seed) for r in requests}
    warm_s = warm_up(executor, vocab, padded=policy.padded_batches or policy.widening_kv, seed=seed)
    return Engine(policy, executor, prompts), warm_s
