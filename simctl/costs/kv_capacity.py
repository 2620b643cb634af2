"""A deployment's KV cache: how many tokens of KV one replica (a model on `tp` GPUs) holds, from its GPUs'
memory, its weights and its dtypes. It is a property of the deployment, not of what prices its iterations:
every command sizes it here (`sim.run.deploy`), whatever its cost model (roofline or a fit).

Per GPU of the TP group (each holds its share of the weights and of the KV heads, `costs.gpu_share`), the
memory left for KV is memory x `--gpu-memory-utilization` (vLLM's default 0.9) less the weights and what the
engine holds back besides; it is divided by the GPU's share of a token's KV. What is held back:
- vllm-v1, on a GPU, as vLLM sizes its cache (`VLLMProfile`; vllm/v1/worker/gpu_worker.py:
  determine_available_memory, vllm/utils/mem_utils.py: memory_profiling): vLLM multiplies the total memory
  CUDA reports (`GPUSpec.reported_memory_bytes`; vllm/v1/worker/utils.py: request_memory), subtracts the
  weights, the peak of a profiling forward over `max_num_batched_tokens` tokens (gpu_model_runner.py:
  profile_run runs `_dummy_run(self.max_num_tokens)` then the sampler) and the non-torch memory it grew by,
  and cuts the rest into whole blocks (vllm/v1/core/kv_cache_utils.py: available_memory // bytes_per_block);
  the pool lends all but its null block. The activation peak is that of a Llama layer's MLP, N x (4 hidden +
  3 intermediate/tp) values: gate_up's output (2 I), the activation's (I) and four hidden-size tensors (the
  residual, the layer's input, its norm, the attention's output). `NON_TORCH_BYTES` (240 MiB: workspaces
  and the sampler's logits, under the forward's peak) is the one constant fitted, to the three KV sizes vLLM
  0.11 reported on an H100 (../shared/reference/gpu_serving/README.md; bench/gpu_serving.py prints them).
  vLLM >= 0.21 also subtracts its CUDA graphs' memory, measured by capturing them (profile_cudagraph_memory,
  VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS): not derivable from shapes, and not in the measured runs (0.11).
  vLLM logs the --gpu-memory-utilization it is equivalent to without them; give that one to match.
- every other policy (simctl's engines and the papers' systems, which vLLM's profile does not describe) and
  the CPU: `activation_reserve_bytes`, 2 GiB per GPU of the datasheet memory: an ASSUMPTION covering the CUDA
  context, NCCL buffers and the peak activations of a few-thousand-token batch of a 7-70B model.
`--kv-cache-tokens` gives the capacity outright, `--num-gpu-blocks-override` (vllm-v1) vLLM's block count.
FP8 (`--dtype fp8`, vLLM's `--quantization fp8`) stores the linear layers' weights in one byte (the embedding
and LM head stay 16-bit: vLLM's Fp8Config quantizes LinearBase layers only); `--kv-cache-dtype fp8` one byte
per KV value.
"""

from __future__ import annotations

from dataclasses import dataclass

from simctl.catalogue.gpus import GiB, GPUSpec
from simctl.catalogue.models import ModelSpec
from simctl.common.checks import is_int
from simctl.common.errors import DoesNotFit, InputError
from simctl.costs.gpu_share import gpu_share

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GiB
NON_TORCH_BYTES = 240 * 2**20
WEIGHT_DTYPES = ("auto", "bfloat16", "float16", "fp8")
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class KVSizing:
    """How the KV cache is sized: vLLM's share of the GPU's memory, the weights' and KV's dtypes, or the
    capacity given outright (`kv_cache_tokens`; vllm-v1: `num_gpu_blocks_override` blocks)."""

    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    dtype: str = "auto"  # the linear weights': auto (the model's 16 bits, or a fit's), bfloat16, float16, fp8
    kv_cache_dtype: str = "auto"  # auto: the model's; fp8: one byte
    kv_cache_tokens: int | None = None
    num_gpu_blocks_override: int | None = None
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES

    def __post_init__(self) -> None:
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {u!r}")
        if self.dtype not in WEIGHT_DTYPES:
            raise InputError(f"--dtype must be one of {', '.join(WEIGHT_DTYPES)}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise InputError(f"--kv-cache-dtype must be one of {', '.join(KV_CACHE_DTYPES)}, "
                             f"got {self.kv_cache_dtype!r}")
        for flag, v in (("--kv-cache-tokens", self.kv_cache_tokens),
                        ("--num-gpu-blocks-override", self.num_gpu_blocks_override)):
            if v is not None and (not is_int(v) or v < 2):
                raise InputError(f"{flag} must be an integer >= 2, got {v!r}")
        if self.kv_cache_tokens is not None and self.num_gpu_blocks_override is not None:
            raise InputError("--kv-cache-tokens and --num-gpu-blocks-override both size the KV cache: "
                             "give one")
        if not self.activation_reserve_bytes >= 0:
            raise InputError(f"activation_reserve_bytes must be >= 0, got {self.activation_reserve_bytes!r}")

    def weight_bytes(self, dtype_bytes: int) -> int:
        """Bytes of a linear layer's weight; `dtype_bytes` the model's (activations', embedding's)."""
        return {"auto": dtype_bytes, "bfloat16": 2, "float16": 2, "fp8": 1}[self.dtype]

    def kv_bytes(self, dtype_bytes: int) -> int:
        return 1 if self.kv_cache_dtype == "fp8" else dtype_bytes

    def recorded(self) -> dict[str, object]:
        """The settings given (a summary records only those that differ from the defaults)."""
        return {k: v for k, v in vars(self).items() if v != getattr(KVSizing(), k)}


@dataclass(frozen=True)
class VLLMProfile:
    """What vLLM's memory profile depends on besides the model: its step's token budget and block size."""

    max_num_batched_tokens: int
    block_size: int


@dataclass(frozen=True)
class ReplicaMemory:
    """What one GPU of a replica holds besides its KV cache, and a token's KV on it."""

    weight_bytes: float  # its share of the weights
    kv_bytes_per_token: int  # its share of one token's K and V over all layers

    @classmethod
    def of(cls, model: ModelSpec, tp: int, dtype_bytes: int, sizing: KVSizing = KVSizing()) -> ReplicaMemory:
        share = gpu_share(model, tp)
        linears = share.linear_params * sizing.weight_bytes(dtype_bytes)
        kv = 2 * model.num_layers * share.kv_heads * model.head_dim * sizing.kv_bytes(dtype_bytes)
        return cls(linears + share.embedding_params * dtype_bytes, kv)


def activation_peak_bytes(model: ModelSpec, tp: int, tokens: int, dtype_bytes: int) -> int:
    """The peak of vLLM's profiling forward over `tokens` tokens on one GPU (this module's docstring)."""
    moe = model.moe
    mlp = model.intermediate_size if moe is None else max(
        model.intermediate_size if moe.dense_layers else 0, moe.experts_per_token * moe.expert_size
        + moe.shared_size)
    return tokens * (4 * model.hidden_size + 3 * mlp // tp) * dtype_bytes


def kv_capacity_tokens(model: ModelSpec, gpu: GPUSpec, tp: int = 1, dtype_bytes: int | None = 2,
                       memory_bytes: float | None = None, sizing: KVSizing = KVSizing(),
                       profile: VLLMProfile | None = None) -> int:
    """KV tokens one replica of `tp` GPUs can cache, the model's dtype `dtype_bytes` (a fit's profiled one;
    None: unknown), on `memory_bytes` per GPU (a fit's recorded device memory; None: the GPU's); `profile`:
    sized as vLLM does (vllm-v1 on a GPU), the pool's null block left out."""
    if sizing.kv_cache_tokens is not None:
        return sizing.kv_cache_tokens
    if dtype_bytes is None:
        raise InputError("the cost model does not record the dtype needed to size the KV cache")
    mem = ReplicaMemory.of(model, tp, dtype_bytes, sizing)
    if profile is not None:
        return (vllm_num_blocks(model, gpu, tp, dtype_bytes, sizing, profile) - 1) * profile.block_size
    if sizing.num_gpu_blocks_override is not None:
        raise InputError("--num-gpu-blocks-override sets vllm-v1's blocks (vLLM's flag); give another policy "
                         "--kv-cache-tokens")
    total = gpu.memory_bytes if memory_bytes is None else memory_bytes
    free = total * sizing.gpu_memory_utilization - mem.weight_bytes - sizing.activation_reserve_bytes
    tokens = int(free // mem.kv_bytes_per_token) if free > 0 else 0
    if tokens <= 0:
        _does_not_fit(model, gpu, tp, mem.weight_bytes + sizing.activation_reserve_bytes, total, sizing)
    return tokens


def vllm_num_blocks(model: ModelSpec, gpu: GPUSpec, tp: int, dtype_bytes: int, sizing: KVSizing,
                    profile: VLLMProfile) -> int:
    """The KV blocks vLLM allocates per GPU (its log's "GPU KV cache size" is these x the block size)."""
    if sizing.num_gpu_blocks_override is not None:
        return sizing.num_gpu_blocks_override
    mem = ReplicaMemory.of(model, tp, dtype_bytes, sizing)
    total = gpu.reported_memory_bytes or gpu.memory_bytes
    held = (mem.weight_bytes + NON_TORCH_BYTES
            + activation_peak_bytes(model, tp, profile.max_num_batched_tokens, dtype_bytes))
    requested = -(-total * sizing.gpu_memory_utilization // 1)  # request_memory's math.ceil
    blocks = int((requested - held) // (mem.kv_bytes_per_token * profile.block_size))
    if blocks < 2:  # the null block and one to lend
        _does_not_fit(model, gpu, tp, held, total, sizing)
    return blocks


def _does_not_fit(model: ModelSpec, gpu: GPUSpec, tp: int, need: float, total: float, s: KVSizing) -> None:
    raise DoesNotFit(
        f"{model.name} does not fit on {gpu.name} with tp={tp}: each GPU needs {need / GiB:.1f} GiB for "
        f"weights and activations but has {total * s.gpu_memory_utilization / GiB:.1f} GiB "
        f"({s.gpu_memory_utilization:.0%} of {total / GiB:.0f} GiB); raise tp or use a larger GPU")
