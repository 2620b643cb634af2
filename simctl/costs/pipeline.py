"""Pipeline parallelism's prices: a replica's layers split into `pp` stages on separate GPUs (each stage a
tensor-parallel group of `tp`), what each stage costs of one micro-batch, what crosses a stage boundary, and
the KV each stage's GPUs can hold. The timing of micro-batches through the stages is
`simctl.serving.pipeline`'s.

- Layers per stage: vLLM's partition (`vllm/distributed/utils.py: get_pp_indices`): an even split, the
  remainder one layer each to the stages before the last, counting back from the second-to-last.
- A stage's time: its share of the layer terms of its cost model's `breakdown` (linears and their
  all-reduces, attention, an eager launch floor: everything priced per layer) and the LM head on the last;
  the host's step overhead is the host's, before stage 0 (`serving.pipeline`). Host and stages sum to
  `iteration_time`. A cost model without a breakdown (a scaled one) or a plan of concurrent streams is split
  by layers alone.
- The boundary: the hidden states and the residual (vLLM's `IntermediateTensors` for Llama-style models,
  `vllm/model_executor/models/llama.py`), T x hidden x dtype bytes each, for the T token rows of the
  micro-batch. Each TP rank sends its 1/tp slice (vLLM's `send_tensor_dict` with an all-gather group), so
  within a node the group's links carry it in parallel; over `link_gbps` (a node's NIC, Sarathi-Serve's
  Falcon-180B: 100 Gbit/s Ethernet between its two 4-GPU stages) the whole tensor crosses the one link. A
  fixed latency per transfer (10 us, an ASSUMPTION of the order of a small NCCL send) is added.
- KV (memory per GPU): a stage's GPUs hold its layers' weights and its layers' KV; the input embedding sits
  on the first stage and the LM head on the last. The replica's KV tokens are the fewest any stage can hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simctl.catalogue.gpus import GPUSpec
from simctl.catalogue.models import ModelSpec
from simctl.common.checks import is_int, is_number
from simctl.common.errors import DoesNotFit, InputError
from simctl.costs.base import CostModel
from simctl.costs.gpu_share import gpu_share
from simctl.costs.kv_capacity import KVSizing, ReplicaMemory, kv_capacity_tokens
from simctl.costs.roofline import Roofline
from simctl.policies.plan import BatchPlan

TRANSFER_LATENCY_S = 10e-6  # ASSUMPTION: one small point-to-point send's fixed time
BOUNDARY_TENSORS = 2  # hidden states and residual
MAX_PP = 64
# terms of a breakdown that are not per layer: the host's (first stage) and the LM head's (last stage)
_HOST, _LM_HEAD = "overhead", "lm_head"


def check_pp(pp: object, model: ModelSpec | None = None) -> int:
    """`pp` checked: an integer from 1 to MAX_PP, at most the model's layers."""
    if not is_int(pp) or not 1 <= pp <= MAX_PP:
        raise InputError(f"--pp must be an integer from 1 to {MAX_PP}, got {pp!r}")
    if model is not None and pp > model.num_layers:
        raise InputError(f"--pp {pp}: {model.name} has only {model.num_layers} layers to split into stages")
    return int(pp)


def check_link(gbps: object) -> None:
    """`--pp-link-gbps`, if given, is a finite number > 0."""
    if gbps is not None and (not is_number(gbps) or not (gbps > 0 and math.isfinite(gbps))):
        raise InputError(f"--pp-link-gbps must be a finite number > 0 (gigabits per second), got {gbps!r}")


def stage_layers(num_layers: int, pp: int) -> list[int]:
    """Layers of each stage, as vLLM partitions them (the module's docstring)."""
    out = [num_layers // pp] * pp
    for i in range(2, num_layers % pp + 2):
        out[-i] += 1
    return out


@dataclass(frozen=True)
class StagedCost:
    """A cost model's iteration split into pipeline stages, and the price of a boundary's transfer."""

    cost: CostModel
    layers: tuple[int, ...]  # layers of each stage
    boundary_bytes_per_token: float  # what crosses one boundary per token row
    link_bytes_per_s: float  # the boundary's bandwidth

    @property
    def stages(self) -> int:
        return len(self.layers)

    def stage_times(self, plan: BatchPlan) -> tuple[float, list[float]]:
        """Seconds the host prepares `plan` and seconds each stage spends on it (they sum to
        `cost.iteration_time(plan)`)."""
        breakdown = getattr(self.cost, "breakdown", None)
        if breakdown is None or plan.streams:
            host = head = 0.0
            per_layer = self.cost.iteration_time(plan)
        else:
            terms = breakdown(plan)
            host, head = terms.pop(_HOST, 0.0), terms.pop(_LM_HEAD, 0.0)
            per_layer = sum(terms.values())
        total = sum(self.layers)
        times = [per_layer * n / total for n in self.layers]
        times[-1] += head
        return host, times

    def boundary_time(self, plan: BatchPlan) -> float:
        """Seconds one micro-batch's activations take to cross a stage boundary."""
        return plan.linear_tokens * self.boundary_bytes_per_token / self.link_bytes_per_s + TRANSFER_LATENCY_S


def staged(cost: CostModel, model: ModelSpec, link_bytes_per_s: float, pp: int,
           dtype_bytes: int = 2) -> StagedCost:
    """`cost` split into `pp` stages of `model`'s layers, boundaries crossing a link of `link_bytes_per_s`
    (the whole tensor's bytes over it: the caller gives a TP group's links their summed bandwidth)."""
    return StagedCost(cost, tuple(stage_layers(model.num_layers, pp)),
                      BOUNDARY_TENSORS * model.hidden_size * dtype_bytes, link_bytes_per_s)


def boundary_link(roofline: Roofline, link_gbps: float | None) -> float:
    """Bytes/s a boundary's transfer runs at: `link_gbps` (one link between nodes) or, within a node, each
    TP rank's slice over its own GPU's link."""
    if link_gbps is not None:
        return link_gbps * 1e9 / 8
    return roofline.tp * roofline.gpu.interconnect_bandwidth


def pipeline_kv_tokens(model: ModelSpec, gpu: GPUSpec, tp: int, pp: int, dtype_bytes: int | None = 2,
                       memory_bytes: float | None = None, sizing: KVSizing = KVSizing()) -> int:
    """KV tokens a replica of `pp` stages can cache: the fewest any stage's GPUs can hold (the module's
    docstring), each GPU's memory sized as `costs.kv_capacity` sizes a replica's (`pp` 1: exactly that)."""
    if pp == 1 or sizing.kv_cache_tokens is not None:
        return kv_capacity_tokens(model, gpu, tp, dtype_bytes, memory_bytes, sizing)
    if dtype_bytes is None:
        raise InputError("the cost model does not record the dtype needed to size the KV cache")
    share, mem = gpu_share(model, tp), ReplicaMemory.of(model, tp, dtype_bytes, sizing)
    head = share.lm_head_params * dtype_bytes
    input_embedding = share.embedding_params * dtype_bytes - (0 if model.tie_word_embeddings else head)
    linears = mem.weight_bytes - share.embedding_params * dtype_bytes
    total = gpu.memory_bytes if memory_bytes is None else memory_bytes
    usable = total * sizing.gpu_memory_utilization - sizing.activation_reserve_bytes
    fewest = None
    for k, n in enumerate(stage_layers(model.num_layers, pp)):
        # a tied LM head is stored once at pp = 1; at pp > 1 the last stage holds its own copy
        weights = linears * n / model.num_layers + (input_embedding if k == 0 else 0) + (head if k == pp - 1
                                                                                            else 0)
        free = usable - weights
        tokens = int(free // (mem.kv_bytes_per_token * n / model.num_layers)) if free > 0 else 0
        fewest = tokens if fewest is None else min(fewest, tokens)
    if not fewest:
        raise DoesNotFit(f"{model.name} does not fit on {gpu.name} with tp={tp} and pp={pp}: a stage's "
                         "weights and activations exceed its GPUs' memory; raise tp or pp")
    return fewest
