"""The sections several commands share, as frozen dataclasses whose fields are their options
(`simctl.config_options`): the workload served (`run`, `capacity`, `plan`, `real`: `traces.workload.Workload`,
the class the simulator's and the real engine's configurations embed), the deployment serving it (`run`,
`capacity`, `plan`) and the real engine's disaggregation (`real`, `validate`). The policy section is
`simctl.policy_options`, the cluster `serving.cluster_config.ClusterConfig`. Each command gives its own
defaults as the instance it declares."""

from __future__ import annotations

from dataclasses import dataclass

from simctl.common.option_fields import option_field
from simctl.traces.workload import Workload

__all__ = ["Deployment", "Execution", "RealDisaggregation", "Workload"]


@dataclass(frozen=True)
class Deployment:
    """What serves them: model, GPU and TP degree (each a comma list compared), how a step is priced, and
    what the server admits."""

    model: str = option_field("mistral-7b", (
        "Model shape from the catalogue, or a path to a transformers config.json of a dense Llama, Mistral, "
        "Qwen2 or Yi model, or a mixture-of-experts Mixtral, Qwen2-MoE or Qwen3-MoE one. A comma list "
        "compares them."))
    gpu: str = option_field("a100-80gb", "GPU from the catalogue; a comma list compares them.")
    tp: str = option_field("1", "Tensor-parallel degree (GPUs per replica); a comma list compares them.",
                           metavar="INTEGER[,...]")
    pp: int = option_field(1, (
        "Pipeline-parallel stages per replica, each on its own --tp GPUs: the layers split as vLLM splits "
        "them, one micro-batch per stage in flight (a virtual engine each, with 1/pp of the KV)."))
    pp_link_gbps: float | None = option_field(None, (
        "The link activations cross between pipeline stages, Gbit/s, when the stages sit on different nodes "
        "[default: each GPU's own interconnect]."))
    routing_skew: float = option_field(0.0, (
        "Mixture-of-experts models, roofline: how unevenly tokens route to experts. Expert i (by popularity) "
        "takes a share of tokens proportional to (i+1)^-skew (Zipf), so a batch reads fewer distinct "
        "experts' weights; 0 is uniform routing."))
    ep: int = option_field(1, (
        "Mixture-of-experts models, roofline: expert parallelism. 1 splits every expert over the --tp GPUs; "
        "--ep equal to --tp gives each GPU whole experts (vLLM's --enable-expert-parallel), and an "
        "iteration waits for the GPU its tokens routed most work to."))
    cost: str | None = option_field(None, (
        "A fitted cost_model.json (from `simctl fit`) instead of the roofline, or a "
        "roofline_calibration.json (`simctl fit --roofline-gpu`) to apply measured efficiencies to --gpu's "
        "specs; --gpu cpu uses the shipped CPU fit by default."))
    max_model_len: int | None = option_field(None, (
        "Positions a request may need, prompt + output, as vLLM's --max-model-len [default: the model's "
        "context]; a longer request is handled as --on-too-long says."))
    front_end_request_s: float = option_field(0.0, (
        "The server's work per request in front of the engine (vllm serve's API server: HTTP, the request's "
        "intake), seconds, served in order by one process; TTFT and E2E then count from the client's send "
        "(summary.json's ttft_from)."))
    front_end_prompt_token_s: float = option_field(0.0, (
        "The server's work per prompt token in front of the engine (tokenization), seconds a token."))
    allreduce: str | None = option_field(None, (
        "Roofline, TP > 1: the all-reduces as vLLM runs them (vllm, the default: its custom one- or two-shot "
        "all-reduce below its size limit on NVLink, NCCL above), or NCCL's ring throughout (nccl: engines "
        "before vLLM's custom all-reduce of 2024)."), metavar="nccl|vllm")
    gpu_memory_utilization: float = option_field(0.9, (
        "Share of each GPU's memory the server manages (vLLM's --gpu-memory-utilization): weights, "
        "activations and the KV cache, which gets the rest (costs/kv_capacity.py)."))
    dtype: str = option_field("auto", (
        "The linear layers' weights: auto (the model's 16 bits, or a fit's dtype), bfloat16, float16, or fp8 "
        "(vLLM's --quantization fp8: one byte a weight, and FP8 tensor throughput where the GPU has it)."),
        metavar="auto|bfloat16|float16|fp8")
    kv_cache_dtype: str = option_field("auto", (
        "The KV cache's values: auto (the model's dtype) or fp8 (one byte; vLLM's --kv-cache-dtype)."),
        metavar="auto|fp8")
    kv_cache_tokens: int | None = option_field(None, (
        "The KV cache's capacity in tokens, given outright instead of sized from the GPU's memory."))
    num_gpu_blocks_override: int | None = option_field(None, (
        "vllm-v1: the KV cache's blocks, as vLLM's --num-gpu-blocks-override (one is its null block)."))
    on_too_long: str = option_field("refuse", (
        "A request longer than --max-model-len: refuse (a server answers it with an error: counted as "
        "`rejected`, out of the latency percentiles, against SLO attainment), error (the whole run stops), "
        "or truncate (its prompt is cut to fit)."), metavar="refuse|error|truncate")


@dataclass(frozen=True)
class Execution:
    """The roofline's step overheads (costs/overheads.py): how the engine launches a step and what its host
    costs per step. The papers' 2023 engines (vLLM 0.1-0.2, Orca's and FasterTransformer's implementations,
    Hugging Face) ran eager."""

    execution: str | None = option_field(None, (
        "Roofline: cuda-graph (the default: the host's 18.1 us a layer and 0.118 ms a request, each step) or "
        "eager (each kernel launched from Python: the step's launch floor too); see costs/overheads.py."),
        metavar="eager|cuda-graph")
    step_overhead_ms: float | None = option_field(None, (
        "Roofline: the host's time per step, ms, beside its 0.118 ms per request [default: 18.1 us a "
        "layer]."))


@dataclass(frozen=True)
class RealDisaggregation:
    """The real engine's disaggregated serving (`real`, `validate`): one prefill process and one decode
    process, KV handed over through shared memory."""

    prefill_instances: int | None = option_field(None, (
        "Disaggregated serving on the real engine (with --decode-instances 1): 1 prefill instance, a process "
        "with its own model and KV that only prefills, then hands each request's KV through shared memory to "
        "the decode instance; --threads is then per instance [default: half the cores]."))
    decode_instances: int | None = option_field(None, (
        "Disaggregated serving on the real engine (with --prefill-instances 1): 1 decode instance, which "
        "admits requests whose KV has arrived and never prefills them."))
