"""Where a cost model was measured, and whether it may price a run. A fitted model's times are those of the
device it was profiled on: it prices that device only. A roofline calibration's efficiencies may stand in for
a similar device or model, with a warning saying so, but never cross between a CPU and a GPU: a CPU's
efficiencies against a GPU's specs predict seconds per token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simctl.catalogue.gpus import catalogue_gpu_of
from simctl.common.errors import InputError


def measured_on(meta: dict[str, Any]) -> str | None:
    """The catalogue name of the device a profile's `meta` describes (None: not recorded, or not
    catalogued)."""
    device = meta.get("device")
    if device is None:
        return None
    return catalogue_gpu_of(str(device), str(meta.get("device_name") or ""))


def check_fitted_device(meta: dict[str, Any], gpu: str) -> None:
    """InputError unless a fitted model profiled on `meta`'s device may price `gpu`."""
    where = measured_on(meta)
    name = meta.get("device_name") or meta.get("device")
    cpu_vs_gpu = meta.get("device") is not None and (str(meta["device"]) == "cpu") != (gpu == "cpu")
    if (where is not None and where != gpu) or cpu_vs_gpu:
        hint = f"run with --gpu {where}" if where else "profile this device"
        raise InputError(f"the cost model was fitted on {name}, so its times are that device's, not {gpu}'s: "
                         f"{hint}, or calibrate the roofline on the profile (simctl fit --roofline-gpu) and "
                         "use that to estimate another GPU")


def fitted_dtype(meta: dict[str, Any]) -> str | None:
    """The dtype a fitted model's profile ran in, as `--dtype` spells it (None: not recorded)."""
    dtype = meta.get("dtype")
    return None if dtype is None else str(dtype).removeprefix("torch.")


def check_fitted_run(meta: dict[str, Any], device: str, device_name: str | None, dtype: str) -> None:
    """InputError unless a fitted model profiled as `meta` says may price real runs on the torch `device`
    (cpu, cuda, cuda:N) named `device_name` (None: not known yet, so only the kind of device is checked) in
    `dtype`. CPUs are one device, as for `check_fitted_device` (their threads are the validation's to match).
    Another dtype is refused, not warned about: its kernels and the bytes they move differ, and a fit has no
    dtype term to carry its times across, so the errors would measure the dtype, not the simulator."""
    fit_device = str(meta.get("device", "cpu")).lower()
    fit_name = meta.get("device_name") or fit_device
    fit_dtype = fitted_dtype(meta)
    how = (f"profile that device (simctl profile --device {device} --dtype {dtype}; simctl fit) and give the "
           "fit as --cost")
    if (fit_device == "cpu") != (device.lower() == "cpu"):
        raise InputError(f"the cost model was profiled on {fit_name} ({fit_device}) and prices only that "
                         f"device, not --device {device}: give --device "
                         f"{'cpu' if fit_device == 'cpu' else 'cuda'}, or {how}")
    names = (str(meta.get("device_name") or "").strip().lower(), (device_name or "").strip().lower())
    if fit_device != "cpu" and all(names) and names[0] != names[1]:
        raise InputError(f"the cost model was profiled on {fit_name}, but --device {device} is "
                         f"{device_name}: a fitted model prices only the device it was profiled on; {how}")
    if fit_dtype is not None and fit_dtype != dtype:
        raise InputError(f"the cost model was profiled in {fit_dtype}, not --dtype {dtype}: its times are "
                         f"that dtype's; give --dtype {fit_dtype}, or {how}")


def calibration_warnings(path: str | Path, model: str, gpu: str) -> list[str]:
    """What applying the roofline calibration at `path` to `model` on `gpu` assumes, one warning each;
    InputError when it cannot hold (a CPU's efficiencies for a GPU, or the reverse)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))  # load_roofline_calibration checked it
    source = data.get("measured_on")
    if source is None:
        raise InputError(f"roofline calibration {path}: it does not record the device it was measured on "
                         "(written by an older simctl); fit its profile again with --roofline-gpu")
    if (source == "cpu") != (gpu == "cpu"):
        raise InputError(f"roofline calibration {path}: its efficiencies were measured on "
                         f"{'a CPU' if source == 'cpu' else source}, and cannot price "
                         f"{'a CPU' if gpu == 'cpu' else gpu}; calibrate on a profile of that kind of device")
    warnings = []
    if source != gpu:
        warnings.append(f"the roofline efficiencies were measured on {source} and are applied to {gpu}: an "
                        "estimate that assumes both reach the same share of their peaks")
    if str(data.get("model", "")).lower() != model.lower():
        warnings.append(f"the roofline efficiencies were measured on {data.get('model')} and are applied to "
                        f"{model}: an estimate that assumes both reach the same share of the device's peaks")
    return warnings
