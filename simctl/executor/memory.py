"""Whether a model fits the device, checked before anything is built: what it needs (weights, KV cache and one
forward's activations, for the dtype) against what the device has (a CPU: the memory available to this
process; cuda: the device's free memory, asked of a child so that this process never holds a CUDA context).

Without it a 70B float32 model (276 GB) was built on a 23 GB machine until the kernel killed it. The need
counted is a lower bound (the largest activation tensors of one forward, no allocator slack or runtime
overhead), so a model refused here cannot run, and one accepted may still fail: then the child's failure says
why (`simctl.common.children.failure_line`). Importable without torch.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
LOGIT_BYTES = 4  # logits are upcast to float32 for sampling
CUDA_QUERY_TIMEOUT_S = 120.0
_CUDA_FREE = ("import sys, torch\n"
              "if torch.cuda.is_available(): print(torch.cuda.mem_get_info(torch.device(sys.argv[1]))[0])")


@dataclass(frozen=True)
class MemoryNeed:
    weights: int  # bytes
    kv: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.kv + self.activations


def memory_need(spec: ModelSpec, dtype: str, kv_tokens: int, step_tokens: int) -> MemoryNeed:
    """Bytes `spec` needs in `dtype` with a KV cache of `kv_tokens` positions and forwards of up to
    `step_tokens` tokens (activations: the residual stream, attention projections and the MLP's widest
    tensors of one layer, and float32 logits of every token)."""
    size = DTYPE_BYTES[dtype]
    mlp = spec.moe.expert_size * spec.moe.experts_per_token if spec.moe else spec.intermediate_size
    attention = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
    per_token = (4 * spec.hidden_size + attention + 3 * mlp) * size
    return MemoryNeed(spec.weight_bytes(size), kv_tokens * spec.kv_bytes_per_token(size),
                      step_tokens * (per_token + spec.vocab_size * LOGIT_BYTES))


def _meminfo_available() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text(encoding="ascii").splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_available() -> int | None:
    """What this process's cgroup (v2) still allows, when it sets a limit."""
    root = Path("/sys/fs/cgroup")
    try:
        limit = (root / "memory.max").read_text(encoding="ascii").strip()
        if limit == "max":
            return None
        return max(0, int(limit) - int((root / "memory.current").read_text(encoding="ascii")))
    except (OSError, ValueError):
        return None


def available_bytes(device: str) -> int | None:
    """Memory a model built on `device` may take now; None when it cannot be told (then nothing is checked:
    e.g. cuda missing, which the child reports)."""
    if str(device).lower() == "cpu":
        known = [b for b in (_meminfo_available(), _cgroup_available()) if b is not None]
        return min(known) if known else None
    try:
        out = subprocess.run([sys.executable, "-c", _CUDA_FREE, str(device)], capture_output=True, text=True,
                             timeout=CUDA_QUERY_TIMEOUT_S, stdin=subprocess.DEVNULL, check=False).stdout
    except subprocess.TimeoutExpired:
        return None
    return int(out) if out.strip().isdigit() else None


def _gb(n: int) -> str:
    return f"{n / 1e9:.3g} GB"


def check_fits(spec: ModelSpec, dtype: str, kv_tokens: int, step_tokens: int, device: str, *,
               instances: int = 1, available: int | None = None) -> None:
    """InputError, with the numbers, if `instances` copies of `memory_need(...)` (processes that each build
    the model) exceed what `device` has (`available`, or asked of the machine)."""
    need = memory_need(spec, dtype, kv_tokens, step_tokens)
    has = available if available is not None else available_bytes(device)
    if has is None or instances * need.total <= has:
        return
    where = "this machine has" if str(device).lower() == "cpu" else f"{device} has"
    copies = f" x {instances} instances" if instances > 1 else ""
    half = instances * memory_need(spec, "bfloat16", kv_tokens, step_tokens).total
    smaller = "" if DTYPE_BYTES[dtype] == 2 else f" (in bfloat16 it needs {_gb(half)})"
    raise InputError(f"{spec.name} in {dtype} needs {_gb(instances * need.total)} (weights "
                     f"{_gb(need.weights)} + KV {_gb(need.kv)} + activations "
                     f"{_gb(need.activations)}{copies}) but {where} {_gb(has)} available{smaller}; choose a "
                     "smaller model or dtype")
