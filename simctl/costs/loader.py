"""The one cost-model loader every command uses: what prices a replica's iterations, from a `--cost` file (a
fit of profiled steps, of operators, or a roofline calibration), the fit shipped for a device, the roofline
from published specs, or a `CostModel` object as is (programmatic use, tests). A validation's speed-scaled
model (`costs.base.ScaledCost`) wraps what this returns.

It prices; it does not size memory. What a fit says about the device it was profiled on (its dtype, the
memory it recorded) comes back beside it for `costs.kv_capacity`, which sizes the deployment's KV cache."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib.resources import files
from pathlib import Path

from simctl.catalogue.gpus import GPUSpec
from simctl.catalogue.models import ModelSpec
from simctl.common.checks import is_number
from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.costs.calibration import is_roofline_calibration, load_roofline_calibration
from simctl.costs.fitted import Fitted
from simctl.costs.overheads import EXECUTION_MODES
from simctl.costs.provenance import calibration_warnings, check_fitted_device
from simctl.costs.roofline import Roofline


@dataclass(frozen=True)
class RooflineOptions:
    """The roofline's own options: an MoE's routing skew and expert parallelism, the all-reduce's
    algorithms (costs.allreduce; None: the roofline's, vLLM's), FP8 weights or KV (1 byte; None: 16-bit)
    and, where a command sets them, the step overheads' execution mode and per step time (a fit carries what
    its profile measured, so none of these applies to one)."""

    routing_skew: float = 0.0
    ep: int = 1
    allreduce: str | None = None
    weight_dtype_bytes: int | None = None
    kv_dtype_bytes: int | None = None
    execution: str | None = None
    overhead_s: float | None = None


@dataclass(frozen=True)
class LoadedCost:
    cost: CostModel
    label: str  # what the summary calls it
    warnings: list[str] = field(default_factory=list)
    dtype_bytes: int | None = 2  # the weights' and KV's bytes it was made for (a fit: its profile's dtype)
    memory_bytes: int | None = None  # the device memory a fit's profile recorded (None: the GPU's)


def default_cost_path(gpu: GPUSpec) -> Path | None:
    """The fitted cost model shipped for a device kind, if any: `cpu` has one, profiled on a 2-core CPU."""
    path = Path(str(files("simctl.profiler") / "profiles" / gpu.name / "cost_model.json"))
    return path if path.is_file() else None


def load_cost(source: str | Path | CostModel | None, model: ModelSpec, gpu: GPUSpec | None, tp: int = 1,
              options: RooflineOptions = RooflineOptions()) -> LoadedCost:
    """The cost model of `model` on `tp` GPUs named by `gpu`: `source` as is when a `CostModel`, a fit (or a
    roofline calibration) when a path, else the fit shipped for the GPU or its roofline. `gpu` None: the
    machine a validation runs on, which only a fit of it prices (`--cost` required)."""
    if isinstance(source, CostModel):
        if isinstance(source, Fitted):
            source.check_model(model)
        return LoadedCost(source, repr(source))
    if options.routing_skew and model.moe is None:
        raise InputError(f"--routing-skew {options.routing_skew:g}: {model.name} is dense (no experts to "
                         "route to)")
    if gpu is None:
        if source is None or not str(source).strip():
            raise InputError("--cost: give the fitted cost model (cost_model.json) of this machine")
        return _fitted(Fitted.load(source), source, model)
    path = source if source is not None else default_cost_path(gpu)
    if options.execution is not None or options.overhead_s is not None:
        check_step_overheads(source, options.execution, None if options.overhead_s is None
                             else options.overhead_s * 1e3)
        return _roofline(model, gpu, tp, options, {}, None)
    if path is None:
        return _roofline(model, gpu, tp, options, {}, "roofline")
    if is_roofline_calibration(path):  # efficiencies calibrated on one device, applied to this GPU's specs
        return _roofline(model, gpu, tp, options, load_roofline_calibration(path),
                         f"roofline calibrated by {path}", calibration_warnings(path, model.name, gpu.name))
    return _checked_fit(Fitted.load(path), path, model, gpu, tp, options)


def check_step_overheads(cost: str | Path | None, execution: str | None,
                         step_overhead_ms: float | None) -> None:
    """--execution and --step-overhead-ms set the roofline's step overheads: a valid mode, a finite time >= 0,
    and no --cost (a fit carries what its profile measured)."""
    if execution is None and step_overhead_ms is None:
        return
    if cost is not None:
        raise InputError("--execution and --step-overhead-ms set the roofline's step overheads; a --cost "
                         "model has its own")
    if execution is not None and execution not in EXECUTION_MODES:
        raise InputError(f"--execution must be one of {', '.join(EXECUTION_MODES)}, got {execution!r}")
    if step_overhead_ms is not None and not (is_number(step_overhead_ms)
                                             and 0 <= step_overhead_ms < float("inf")):
        raise InputError(f"--step-overhead-ms must be a finite number >= 0, got {step_overhead_ms}")


def _roofline(model: ModelSpec, gpu: GPUSpec, tp: int, o: RooflineOptions, params: dict[str, float],
              label: str | None, warnings: list[str] | None = None) -> LoadedCost:
    given = {} if o.execution is None and o.overhead_s is None else {  # else the roofline's defaults
        "execution": o.execution or "cuda-graph", "overhead_s": o.overhead_s}
    if o.allreduce is not None:
        given["allreduce"] = o.allreduce
    roofline = Roofline(model, gpu, tp=tp, routing_skew=o.routing_skew, ep=o.ep,
                        weight_dtype_bytes=o.weight_dtype_bytes, kv_dtype_bytes=o.kv_dtype_bytes,
                        **params, **given)
    return LoadedCost(roofline, label or f"roofline ({roofline.steps.describe()})", warnings or [])


def _checked_fit(fitted: Fitted, path: str | Path, model: ModelSpec, gpu: GPUSpec, tp: int,
                 o: RooflineOptions) -> LoadedCost:
    """A fit, refused for options it cannot honour: another device, TP degree, routing or all-reduce."""
    if o.routing_skew:
        raise InputError(f"--routing-skew {o.routing_skew:g} sets the roofline's routing; the fit {path} "
                         "prices the routing its profiled router did")
    if o.ep != 1 or o.allreduce is not None:
        what = (f"--ep {o.ep} spreads experts over GPUs" if o.ep != 1
                else f"--allreduce {o.allreduce} prices TP")
        raise InputError(f"{what} in the roofline; the fit {path} prices what it profiled")
    if o.weight_dtype_bytes is not None or o.kv_dtype_bytes is not None:
        raise InputError(f"--dtype and --kv-cache-dtype price the roofline's bytes; the fit {path} prices "
                         "the dtype it profiled")
    loaded = _fitted(fitted, path, model)
    check_fitted_device(fitted.meta, gpu.name)
    if tp != fitted.tp:
        raise InputError(f"--tp {tp}: the cost model was fitted for tp={fitted.tp} (its times are per GPU of "
                         f"that group, all-reduces included); run with --tp {fitted.tp} or fit that degree")
    return loaded


def _fitted(fitted: Fitted, path: str | Path, model: ModelSpec) -> LoadedCost:
    fitted.check_model(model)
    return LoadedCost(fitted, f"fitted {path}", [], fitted.dtype_bytes, fitted.memory_bytes)
