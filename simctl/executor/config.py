"""One executor configuration: how the profiler and the real engine run a model's iterations. It is recorded
in a profile's meta.json (so in its fit's cost_model.json) and in a real run's summary.json, and a fit prices
only runs made with the configuration it was profiled with (`check_same`: `simctl validate` and a real run's
twin refuse another). No torch here: the command line and the cost-model checks read it without starting
torch.

`attention` chooses the SDPA kernels (`torch.nn.attention.sdpa_kernel` around every forward,
`executor.ragged`). The default never lets torch pick cuDNN on CUDA: cuDNN builds an execution plan per new KV
length, and serving grows every context by one token per step, so a served decode step paid a fresh plan
each time (3-4x an H100 profile of the same shapes, which repeat one length and keep the plan cached; simctl
issue 11). Masked grouped-query calls fold the query heads of a KV group into the query axis, so the
memory-efficient kernel (which takes masks but not grouped heads) runs them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from simctl.common.errors import InputError
from simctl.costs.graph_buckets import GraphShapes

if TYPE_CHECKING:
    import torch

ATTENTION: dict[str, str] = {
    "auto": "CUDA: flash or memory-efficient, torch's pick per call, never cuDNN; CPU: flash or math",
    "flash": "flash attention only",
    "efficient": "the memory-efficient kernel only (CUDA)",
    "math": "the unfused math kernel only (slow: a reference)",
    "any": "torch's own pick among all its kernels, cuDNN included (simctl before issue 11)",
}

# SDPA backends each setting allows, by device type ("cpu" or "cuda"), in torch's priority order; names are
# `torch.nn.attention.SDPBackend` members, lower-cased without "_ATTENTION". A CPU has only flash and math, so
# `auto` and `any` allow the same there.
_BACKENDS: dict[str, dict[str, tuple[str, ...]]] = {
    "auto": {"cuda": ("flash", "efficient"), "cpu": ("flash", "math")},
    "flash": {"cuda": ("flash",), "cpu": ("flash",)},
    "efficient": {"cuda": ("efficient",)},
    "math": {"cuda": ("math",), "cpu": ("math",)},
    "any": {"cuda": ("cudnn", "flash", "efficient", "math"), "cpu": ("flash", "math")},
}


def device_type(device: str | torch.device) -> str:
    """"cpu" or "cuda" of a device name ("cuda:1" -> "cuda")."""
    return "cuda" if str(device).lower().startswith("cuda") else "cpu"


def eager_on(device: str | torch.device, eager: bool | None = None, moe: bool = False) -> bool:
    """`eager` as given, else the default: CUDA graphs on a GPU, eager on a CPU and for a mixture of experts
    (`moe`; its decode steps are not graphed, `simctl.executor.cuda_graphs`)."""
    return eager if eager is not None else device_type(device) == "cpu" or moe


@dataclass(frozen=True)
class ExecutorConfig:
    attention: str = "auto"  # a key of ATTENTION
    # kernels launched one by one from Python; False: decode steps replay CUDA graphs (CUDA only,
    # executor/cuda_graphs.py), their batch padded to the graph's bucket (costs/graph_buckets.py)
    eager: bool = True

    def validate(self, device: str = "cpu") -> None:
        """InputError for a setting that cannot run on `device` (spelled as the CLI options)."""
        if self.attention not in ATTENTION:
            raise InputError(f"--attention {self.attention!r} unknown; choose one of {', '.join(ATTENTION)}")
        if device_type(device) not in _BACKENDS[self.attention]:
            raise InputError(f"--attention {self.attention}: {ATTENTION[self.attention]}; it has no kernel "
                             f"on {device_type(device)}")
        if not self.eager and device_type(device) != "cuda":
            raise InputError("--cuda-graphs needs a CUDA device; a CPU runs eager (--eager)")

    def backends(self, device: str) -> tuple[str, ...]:
        """The SDPA backends this configuration allows on `device`, in torch's priority order."""
        self.validate(device)
        return _BACKENDS[self.attention][device_type(device)]

    def record(self, device: str) -> dict[str, Any]:
        """What meta.json and summary.json record: the settings, and the backends they allow on `device`."""
        graphs = {} if self.eager else {"cuda_graphs": GraphShapes().to_json()}
        return {"attention": self.attention, "eager": self.eager,
                "attention_backends": list(self.backends(device)), **graphs}

    @classmethod
    def of_record(cls, record: Mapping[str, Any]) -> ExecutorConfig:
        """The configuration a profile's meta, a fit's or a real run's summary records. One without it was
        made before the configuration existed, when torch picked among all its SDPA kernels: `any` (on a CPU
        the same kernels as `auto`)."""
        rec = record.get("executor_config")
        if rec is None:
            return cls(attention="any")
        return cls(attention=rec["attention"], eager=rec["eager"])


DEFAULT_CONFIG = ExecutorConfig()


def check_same(fit: Mapping[str, Any], run: Mapping[str, Any], cost: str = "the cost model") -> None:
    """InputError unless `run` (a real run's summary) was made with an executor configuration that allows the
    same kernels as the one `fit` (a profile's meta, as a fit keeps it) was profiled with: the fit's times are
    that executor's."""
    a, b = ExecutorConfig.of_record(fit), ExecutorConfig.of_record(run)
    da, db = device_type(fit.get("device", "cpu")), device_type(run.get("device", "cpu"))
    if (a.backends(da), a.eager) != (b.backends(db), b.eager):
        raise InputError(f"{cost} was profiled with --attention {a.attention} ({', '.join(a.backends(da))}), "
                         f"the real run uses --attention {b.attention} ({', '.join(b.backends(db))}): its "
                         f"times are another executor's; run with --attention {a.attention}, or profile and "
                         f"fit with --attention {b.attention}")
