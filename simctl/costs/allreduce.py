"""What a tensor-parallel group's all-reduces of one iteration cost (two per layer, T tokens x hidden each):
NCCL's ring (`ring_terms`, `allreduce="nccl"`), or as vLLM runs them (`"vllm"`, the roofline's default).

vLLM on CUDA takes an input under its custom all-reduce's size limit when the group is 2 GPUs or all connected
by NVLink (vllm/distributed/device_communicators/custom_all_reduce.py: `should_custom_ar`; `max_size` 8 MiB
by default, capped on Hopper at 8 GPUs to 256 KiB by all_reduce_utils.py's CUSTOM_ALL_REDUCE_MAX_SIZES);
larger inputs go to symmetric memory or NCCL, priced as NCCL's ring. vLLM's csrc/custom_all_reduce.cuh picks
the kernel: one-shot (each GPU reads every peer's whole input over NVLink and reduces it) at 2 GPUs, or at
<= 4 GPUs under 512 KiB, <= 8 under 256 KiB; two-shot (a reduce-scatter, then an all-gather through the
peers' buffers) above:

    one-shot: CUSTOM_LATENCY_S + (tp - 1) x bytes / (link x efficiency)
    two-shot: 2 x CUSTOM_LATENCY_S + 2 (tp - 1) / tp x bytes / (link x efficiency)

CUSTOM_LATENCY_S = 6 us: vLLM's H100 benchmark in its PR #24111 timed a one-shot of 0.5 MB at TP 2 in 7 us,
6 us plus its bytes at the link's efficiency. The efficiency is the GPU's measured NCCL one (an ASSUMPTION:
the same NVLink moves both), and a two-shot pays the latency per stage (an ASSUMPTION). Where the custom path
applies, NCCL's fixed 26-44 us a call (catalogue.gpus.AllReduceFit) is gone: most of a decode step's
all-reduce time.
"""

from __future__ import annotations

from simctl.catalogue.gpus import GPUSpec
from simctl.common.checks import is_number
from simctl.common.errors import InputError

ALLREDUCE_MODES = ("nccl", "vllm")
# the ring's fixed latency where the catalogue has no measurement: an ASSUMPTION (the order of a small-message
# NCCL all-reduce within a node); the link then at its peak
DEFAULT_ALLREDUCE_LATENCY_S = 10e-6
CUSTOM_LATENCY_S = 6e-6  # see the module docstring (vLLM PR #24111, H100, TP 2)
CUSTOM_MAX_BYTES = 8 * 2**20  # custom_all_reduce.py: CustomAllreduce(max_size=8192 * 1024)
HOPPER_8_GPU_MAX_BYTES = 2**20 // 4  # all_reduce_utils.py: CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"][8]
ONE_SHOT_UNDER = ((2, CUSTOM_MAX_BYTES), (4, 512 * 1024), (8, 256 * 1024))  # custom_all_reduce.cuh
SUPPORTED_WORLD_SIZES = (2, 4, 6, 8)  # custom_all_reduce.cuh's kernels


def check_allreduce(mode: str) -> str:
    if mode not in ALLREDUCE_MODES:
        raise InputError(f"--allreduce must be one of {', '.join(ALLREDUCE_MODES)}, got {mode!r}")
    return mode


def ring_terms(g: GPUSpec, tp: int, latency_s: float | None, efficiency: float | None) -> tuple[float, float]:
    """NCCL's ring's fixed latency and link efficiency: as given, else the GPU's measured ones at this degree
    (or the nearest), else the defaults."""
    measured = g.allreduce_at(tp)
    if latency_s is None:
        latency_s = measured.latency_s if measured else DEFAULT_ALLREDUCE_LATENCY_S
    if not latency_s >= 0:
        raise InputError(f"allreduce_latency_s must be >= 0, got {latency_s!r}")
    if efficiency is None:
        efficiency = measured.efficiency if measured else 1.0
    if not (is_number(efficiency) and 0.0 < efficiency <= 1.0):
        raise InputError(f"allreduce_efficiency must be in (0, 1], got {efficiency!r}")
    return float(latency_s), float(efficiency)


def uses_custom(tp: int, fully_connected: bool) -> bool:
    """Whether vLLM's custom all-reduce runs on a group of `tp` GPUs (`should_custom_ar`)."""
    return tp in SUPPORTED_WORLD_SIZES and (tp == 2 or fully_connected)


class VLLMAllReduce:
    """`calls` all-reduces of `token_bytes` per token over a link of `link_bytes_s` (its reachable rate) as
    vLLM runs them; above the custom limit, NCCL's ring as the roofline prices it (`ring_tok` x T +
    `ring_fixed`)."""

    __slots__ = ("calls", "limit", "link", "one_shot_under", "ring_fixed", "ring_tok", "token_bytes", "tp")

    def __init__(self, tp: int, calls: int, token_bytes: int, link_bytes_s: float, hopper: bool,
                 ring_tok: float, ring_fixed: float) -> None:
        self.tp, self.calls, self.token_bytes, self.link = tp, calls, token_bytes, link_bytes_s
        self.ring_tok, self.ring_fixed = ring_tok, ring_fixed
        self.limit = HOPPER_8_GPU_MAX_BYTES if hopper and tp == 8 else CUSTOM_MAX_BYTES
        self.one_shot_under = next(b for most, b in ONE_SHOT_UNDER if tp <= most)

    def of(self, tokens: int) -> float:
        nbytes = tokens * self.token_bytes
        if nbytes >= self.limit:
            return self.ring_tok * tokens + self.ring_fixed
        if nbytes < self.one_shot_under:
            return self.calls * (CUSTOM_LATENCY_S + (self.tp - 1) * nbytes / self.link)
        return self.calls * (2 * CUSTOM_LATENCY_S + 2.0 * (self.tp - 1) / self.tp * nbytes / self.link)
