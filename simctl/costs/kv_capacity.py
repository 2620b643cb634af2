"""A deployment's KV cache: how many tokens of KV one replica (a model on `tp` GPUs) holds, from its GPUs'
memory, its weights and its dtypes. It is a property of the deployment, not of what prices its iterations:
every command sizes it here (`sim.run.deploy`), whatever its cost model (roofline or a fit).

Per GPU of the TP group (each holds its share of the weights and of the KV heads, `costs.gpu_share`):
memory x utilization - weights - an activation reserve, over the GPU's share of a token's KV.
- gpu_memory_utilization = 0.9: vLLM's default share of GPU memory it manages.
- activation_reserve_bytes = 2 GiB per GPU: an ASSUMPTION covering the CUDA context, NCCL buffers and the peak
  activations of a few-thousand-token batch of a 7-70B model, which serving engines subtract before sizing
  the KV cache.
"""

from __future__ import annotations

from dataclasses import dataclass

from simctl.catalogue.gpus import GiB, GPUSpec
from simctl.catalogue.models import ModelSpec
from simctl.common.errors import DoesNotFit, InputError
from simctl.costs.gpu_share import gpu_share

DEFAULT_GPU_MEMORY_UTILIZATION = 0.9
DEFAULT_ACTIVATION_RESERVE_BYTES = 2 * GiB


@dataclass(frozen=True)
class KVSizing:
    """How the KV cache is sized from the memory left: vLLM's share of the GPU's memory and what is held
    back for activations."""

    gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION
    activation_reserve_bytes: float = DEFAULT_ACTIVATION_RESERVE_BYTES

    def __post_init__(self) -> None:
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0.0 < u <= 1.0:
            raise InputError(f"--gpu-memory-utilization must be in (0, 1], got {u!r}")
        if not self.activation_reserve_bytes >= 0:
            raise InputError(f"activation_reserve_bytes must be >= 0, got {self.activation_reserve_bytes!r}")


@dataclass(frozen=True)
class ReplicaMemory:
    """What one GPU of a replica holds besides its KV cache, and a token's KV on it."""

    memory_bytes: float  # the GPU's memory
    weight_bytes: float  # its share of the weights
    kv_bytes_per_token: int  # its share of one token's K and V over all layers

    @classmethod
    def of(cls, model: ModelSpec, tp: int, dtype_bytes: int, memory_bytes: float) -> ReplicaMemory:
        share = gpu_share(model, tp)
        return cls(memory_bytes, (share.linear_params + share.embedding_params) * dtype_bytes,
                   2 * model.num_layers * share.kv_heads * model.head_dim * dtype_bytes)


def kv_capacity_tokens(model: ModelSpec, gpu: GPUSpec, tp: int = 1, dtype_bytes: int | None = 2,
                       memory_bytes: float | None = None, sizing: KVSizing = KVSizing()) -> int:
    """KV tokens one replica of `tp` GPUs can cache, its weights and KV in `dtype_bytes` (a fit's profiled
    dtype; None: unknown), on `memory_bytes` per GPU (a fit's recorded device memory; None: the GPU's)."""
    if dtype_bytes is None:
        raise InputError("the cost model does not record the dtype needed to size the KV cache")
    mem = ReplicaMemory.of(model, tp, dtype_bytes, gpu.memory_bytes if memory_bytes is None else memory_bytes)
    usable = mem.memory_bytes * sizing.gpu_memory_utilization
    free = usable - mem.weight_bytes - sizing.activation_reserve_bytes
    tokens = int(free // mem.kv_bytes_per_token) if free > 0 else 0
    if tokens <= 0:
        need = (mem.weight_bytes + sizing.activation_reserve_bytes) / GiB
        raise DoesNotFit(
            f"{model.name} does not fit on {gpu.name} with tp={tp}: each GPU needs {need:.1f} GiB for "
            f"weights and activations but has {usable / GiB:.1f} GiB ({sizing.gpu_memory_utilization:.0%} of "
            f"{mem.memory_bytes / GiB:.0f} GiB); raise tp or use a larger GPU")
    return tokens
