"""Accelerator specs the roofline cost model prices against: a catalogue of published datasheet numbers.

Conventions:
- `peak_flops`: dense (no 2:4 sparsity) BF16/FP16 tensor-core FLOP/s with FP32 accumulation. Datasheets often
  print the sparse figure; it is halved here.
- `mem_bandwidth`: peak DRAM (HBM/GDDR) bandwidth in bytes/s (decimal GB, as datasheets mean it).
- `memory_bytes`: DRAM capacity. Datasheet "80 GB" is binary (80 GiB: the driver reports 81920 MiB on an
  A100-80GB), so capacities are stored as GiB x 2**30.
- `interconnect_bandwidth`: per-GPU, per-direction bandwidth of the link a tensor-parallel all-reduce runs
  over: NVLink where the part has it, else PCIe Gen4 x16 (64 GB/s bidirectional = 32 GB/s each way). Peak
  link numbers; NCCL achieves less.
- `fp8_flops`: dense FP8 tensor-core FLOP/s (Hopper, Blackwell, CDNA3), what FP8 weights' GEMMs run at
  (vLLM's fp8 W8A8); None: no FP8 tensor cores (an A100 runs FP8 weights through 16-bit math).
- `tile`: the M-tile (token rows) of the linear-layer GEMM kernels; 128 on these GPUs.
- `mfu`, `mbu`, `gemm_latency_s`: the roofline's GEMM efficiencies and per-GEMM fixed time where measured
  (None: the roofline's defaults). Fitted by bench/roofline_vs_measured.py to Vidur's published operator times
  (A100, H100, A40; fitted on Llama-2-7B, Llama-2-70B and InternLM-20B, checked on the other models:
  bench/results/roofline_vs_measured.md), except the H100's and H200's mbu: fitted to vLLM served and
  benchmarked with the step's host terms (costs/overheads.py; research/results/gpu_step_forms.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from simctl.common.errors import InputError

GiB = 2**30
PCIE4_X16_PER_DIRECTION = 32e9  # source: PCI-SIG PCIe 4.0 spec, 16 GT/s x 16 lanes ~ 32 GB/s each way


@dataclass(frozen=True, slots=True)
class AllReduceFit:
    """A ring all-reduce of `tp` GPUs in one node as measured: latency_s + 2 (tp - 1) / tp x bytes over the
    link at `efficiency` of its peak. Per degree: NCCL's latency and reachable bandwidth differ with it (A100:
    39-44 us and 0.50-0.57 of the link over tp 2-8, bench/results/roofline_vs_measured.md)."""

    tp: int
    efficiency: float
    latency_s: float


@dataclass(frozen=True, slots=True)
class GPUSpec:
    name: str
    peak_flops: float  # dense bf16/fp16 FLOP/s
    mem_bandwidth: float  # bytes/s
    memory_bytes: int
    interconnect_bandwidth: float  # bytes/s per GPU per direction, for all-reduce
    tile: int = 128
    description: str = ""
    mfu: float | None = None
    mbu: float | None = None
    gemm_latency_s: float | None = None
    allreduce: tuple[AllReduceFit, ...] = ()  # measured all-reduces, by TP degree (none: the defaults)
    # every GPU of a node reaches every other over NVLink (an SXM part's NVSwitch), and the architecture:
    # where vLLM runs its custom all-reduce, and with which size limit (costs.allreduce)
    fully_connected: bool = False
    architecture: str = ""
    # the total memory CUDA reports (torch.cuda.mem_get_info), which vLLM multiplies by
    # --gpu-memory-utilization (vllm/v1/worker/utils.py: request_memory); None: `memory_bytes`
    reported_memory_bytes: int | None = None
    fp8_flops: float | None = None  # dense FP8 tensor FLOP/s where the part has FP8 tensor cores

    def __post_init__(self) -> None:
        for f in ("peak_flops", "mem_bandwidth", "memory_bytes", "interconnect_bandwidth", "tile"):
            v = getattr(self, f)
            if not v > 0:
                raise InputError(f"GPU {self.name!r}: {f} must be positive, got {v!r}")

    def allreduce_at(self, tp: int) -> AllReduceFit | None:
        """The measured all-reduce of the degree nearest `tp` (the larger on a tie), or None."""
        return max(self.allreduce, key=lambda a: (-abs(a.tp - tp), a.tp), default=None)


GPUS: dict[str, GPUSpec] = {g.name: g for g in [
    # source: NVIDIA A100 Tensor Core GPU datasheet: BF16 tensor 312 TFLOPS dense (624 sparse); A100 80GB SXM
    # 2,039 GB/s HBM2e, 80 GB; NVLink 600 GB/s (bidirectional, 300 GB/s each way)
    # measured (bench/results/roofline_vs_measured.md, Vidur's A100 profiles): mfu 0.757, mbu 0.819, 6.9 us
    # per GEMM; NCCL all-reduce per TP degree (DGX A100)
    GPUSpec("a100-80gb", 312e12, 2039e9, 80 * GiB, 300e9, mfu=0.757, mbu=0.819, gemm_latency_s=6.9e-6,
            allreduce=(AllReduceFit(2, 0.565, 43.7e-6), AllReduceFit(4, 0.536, 38.8e-6),
                       AllReduceFit(8, 0.503, 42.5e-6)),
            fully_connected=True, architecture="ampere",
            description="NVIDIA A100 80GB SXM: 312 TFLOP/s bf16, 2039 GB/s HBM2e, NVLink 600 GB/s"),
    # source: NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BF16 1,979 TFLOPS with sparsity (989 dense);
    # 3.35 TB/s HBM3, 80 GB; NVLink 900 GB/s (bidirectional)
    # measured (as the A100): mfu 0.717, 7.57 us per GEMM, all-reduce per TP degree (DGX H100); mbu 0.856:
    # fitted to vLLM served (Llama-2-7B, CodeLlama-34B) and vLLM's CI Llama-3.1-8B case on H100s together with
    # the host's step terms (research/results/gpu_step_forms.md, split A; Vidur's kernel times alone give
    # 0.994, which with 2 ms a step left served decode 10% fast on CodeLlama-34B, 8% slow on Llama-2-7B)
    # FP8 3,958 TFLOPS with sparsity (1,979 dense). CUDA reports 81,082-81,090 MiB of it
    # (torch.cuda.get_device_properties on "NVIDIA H100 80GB HBM3" in public environment dumps, by driver)
    GPUSpec("h100", 989e12, 3350e9, 80 * GiB, 450e9, mfu=0.717, mbu=0.856, gemm_latency_s=7.57e-6,
            allreduce=(AllReduceFit(2, 0.726, 26.1e-6), AllReduceFit(4, 0.863, 33.0e-6),
                       AllReduceFit(8, 0.759, 29.7e-6)),
            fully_connected=True, architecture="hopper", reported_memory_bytes=81089 * 2**20,
            fp8_flops=1979e12,
            description="NVIDIA H100 SXM 80GB: 989 TFLOP/s bf16, 3350 GB/s HBM3, NVLink 900 GB/s"),
    # source: NVIDIA H200 Tensor Core GPU datasheet, H200 SXM: BF16 1,979 TFLOPS with sparsity (989 dense);
    # 4.8 TB/s HBM3e, 141 GB; NVLink 900 GB/s (bidirectional)
    # FP8 3,958 TFLOPS with sparsity (1,979 dense); CUDA reports 143,156 MiB (a public environment dump)
    # mbu 0.633: fitted to ONE measurement, vLLM's CI Llama-3.1-8B case on an H200, with the host's step terms
    # (research/results/gpu_step_forms.md, split A; its 70B and Mixtral H200 cases held out: -7.5%, +5.3%)
    GPUSpec("h200", 989e12, 4800e9, 141 * GiB, 450e9, mbu=0.633, fully_connected=True, architecture="hopper",
            reported_memory_bytes=143156 * 2**20, fp8_flops=1979e12,
            description="NVIDIA H200 SXM 141GB: 989 TFLOP/s bf16, 4800 GB/s HBM3e, NVLink 900 GB/s"),
    # UNVALIDATED (datasheet numbers only, no measurement yet), the next three:
    # source: NVIDIA DGX B200 / HGX B200 datasheet, per GPU (the 8-GPU figures / 8): FP8 72 PFLOPS and
    # FP16/BF16 36 PFLOPS with sparsity (4.5 and 2.25 PFLOPS dense), HBM3e 1,440 GB (180 GB) at 64 TB/s
    # (8 TB/s); fifth-generation NVLink 1.8 TB/s (bidirectional, 900 GB/s each way) through NVSwitch
    GPUSpec("b200", 2250e12, 8000e9, 180 * GiB, 900e9, fully_connected=True, architecture="blackwell",
            fp8_flops=4500e12,
            description="NVIDIA B200 (HGX) 180GB: 2250 TFLOP/s bf16, 4500 fp8, 8000 GB/s HBM3e, NVLink "
                        "1.8 TB/s; UNVALIDATED"),
    # source: AMD Instinct MI300X datasheet: FP16/BF16 1,307.4 TFLOPS dense (2,614.9 with sparsity), FP8
    # 2,614.9 dense; 192 GB HBM3 at 5.3 TB/s; Infinity Fabric 896 GB/s aggregate per GPU (7 links to the
    # other GPUs of an 8-GPU platform: 448 GB/s each way over all of them)
    GPUSpec("mi300x", 1307.4e12, 5300e9, 192 * GiB, 448e9, fully_connected=True, architecture="cdna3",
            fp8_flops=2614.9e12,
            description="AMD Instinct MI300X 192GB: 1307 TFLOP/s bf16, 2615 fp8, 5300 GB/s HBM3; "
                        "UNVALIDATED"),
    # source: AMD Instinct MI325X datasheet: compute as the MI300X (FP16/BF16 1,307.4, FP8 2,614.9 TFLOPS
    # dense); 256 GB HBM3E at 6 TB/s; Infinity Fabric 896 GB/s aggregate
    GPUSpec("mi325x", 1307.4e12, 6000e9, 256 * GiB, 448e9, fully_connected=True, architecture="cdna3",
            fp8_flops=2614.9e12,
            description="AMD Instinct MI325X 256GB: 1307 TFLOP/s bf16, 2615 fp8, 6000 GB/s HBM3E; "
                        "UNVALIDATED"),
    # source: NVIDIA RTX A6000 datasheet: tensor performance 309.7 TFLOPS with sparsity (154.8 dense);
    # 768 GB/s GDDR6, 48 GB; PCIe Gen 4 x16 (a 2-GPU NVLink bridge is optional; not assumed)
    GPUSpec("a6000", 154.8e12, 768e9, 48 * GiB, PCIE4_X16_PER_DIRECTION,
            description="NVIDIA RTX A6000: 155 TFLOP/s bf16, 768 GB/s GDDR6, 48 GB, PCIe Gen4"),
    # source: NVIDIA A40 datasheet: BF16 tensor 149.7 TFLOPS dense (299.4 sparse); 696 GB/s GDDR6, 48 GB;
    # PCIe Gen4 x16 (NVLink bridge optional; not assumed)
    # measured (as the A100): mfu 0.788, mbu 0.823, 13.9 us per GEMM (no all-reduce measured)
    GPUSpec("a40", 149.7e12, 696e9, 48 * GiB, PCIE4_X16_PER_DIRECTION, mfu=0.788, mbu=0.823,
            gemm_latency_s=13.86e-6,
            description="NVIDIA A40: 150 TFLOP/s bf16, 696 GB/s GDDR6, 48 GB, PCIe Gen4"),
    # source: NVIDIA L4 Tensor Core GPU datasheet: BF16 tensor 242 TFLOPS with sparsity (121 dense);
    # 300 GB/s GDDR6, 24 GB; PCIe Gen4 x16
    GPUSpec("l4", 121e12, 300e9, 24 * GiB, PCIE4_X16_PER_DIRECTION,
            description="NVIDIA L4: 121 TFLOP/s bf16, 300 GB/s GDDR6, 24 GB, PCIe Gen4"),
    # source: NVIDIA Ada Lovelace GPU architecture whitepaper, GeForce RTX 4090: peak FP16/BF16 tensor with
    # FP32 accumulate 165.2 TFLOPS dense; 1,008 GB/s GDDR6X, 24 GB; PCIe Gen4 x16, no NVLink
    GPUSpec("rtx-4090", 165.2e12, 1008e9, 24 * GiB, PCIE4_X16_PER_DIRECTION,
            description="NVIDIA GeForce RTX 4090: 165 TFLOP/s bf16 (fp32 acc.), 1008 GB/s GDDR6X, 24 GB"),
    # PLACEHOLDER, NOT MEASURED AND NOT FROM A DATASHEET: round made-up numbers for a typical 2-core x86 cloud
    # host (AVX2 FMA at ~2.5 GHz: 2 cores x 32 fp32 FLOP/cycle ~ 160 GFLOP/s peak, ~20 GB/s DRAM, 16 GiB).
    # Only there so CPU runs have something to price with; to be replaced by the profiler's fitted model.
    # tile=1: no tile quantization is assumed on CPU.
    GPUSpec("cpu", 160e9, 20e9, 16 * GiB, 10e9, tile=1,
            description="PLACEHOLDER 2-core CPU host (made-up round numbers; use a profiled/fitted model)"),
]}


# The word by which each catalogue GPU shows in its device name (torch.cuda.get_device_name, e.g. "NVIDIA H100
# 80GB HBM3"): how a profile's device is matched to the catalogue entry whose specs describe it.
DEVICE_NAME_MARKERS = {"a100-80gb": "A100", "h100": "H100", "h200": "H200", "a6000": "A6000", "a40": "A40",
                       "l4": "L4", "rtx-4090": "4090", "b200": "B200", "mi300x": "MI300X", "mi325x": "MI325X"}


def catalogue_gpu_of(device: str, device_name: str) -> str | None:
    """The catalogue name of a profiled device: `cpu` for any CPU, the GPU whose marker is a word of a CUDA
    device's name, or None when the catalogue has no such GPU."""
    if device == "cpu":
        return "cpu"
    words = set(re.split(r"[^A-Za-z0-9]+", device_name.upper()))
    return next((gpu for gpu, marker in DEVICE_NAME_MARKERS.items() if marker in words), None)


def get_gpu(name: str) -> GPUSpec:
    try:
        return GPUS[str(name).lower()]
    except KeyError:
        raise InputError(f"unknown GPU {name!r}; known GPUs: {', '.join(GPUS)}") from None
