"""Fit a cost model to a profile: `profiles/NAME/{profile.csv, meta.json}` -> `cost_model.json` + `fit.png`.

    report = fit_profile("profiles/tiny-cpu")            # writes cost_model.json and fit.png next to it
    print(format_report(report))
    cost = Fitted.load(report.cost_model_path)            # a CostModel for the simulator

The functional form is `costs.fitted_form`'s (see its docstring): scalar coefficients and three monotone
piecewise-linear curves (the linear layers over tiled T, the LM head over tiled r, a decode row's attention
over its KV length). A seeded random `holdout` share of each kind of row is held out (stratified by kind;
every kind keeps at least one training row); the form is fitted on the rest (`profiler/fit_coefficients.py`
says how) and the held-out rows measure it.

`roofline_gpu` additionally calibrates `Roofline(model, gpu)`'s efficiencies (mfu, mbu = attn_mbu, attn_mfu)
in (0, 1] and its overhead_s >= 0 to the same training rows (least squares on relative error, with the
profile's fitted tile) and writes them to `roofline_calibration.json`, so a profile of one device can price a
similar one: `Roofline(model, other_gpu, **load_roofline_calibration(path))`.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.recorded_model import dtype_bytes_of
from simctl.common.errors import InputError
from simctl.costs.calibration import CALIBRATION_FORMAT
from simctl.costs.fit_results import ErrorStats, FitReport, RooflineCalibration, error_stats
from simctl.costs.fitted import Fitted
from simctl.costs.provenance import measured_on
from simctl.executor.config import ExecutorConfig
from simctl.plots.fit import fit_figure
from simctl.profiler.fit_coefficients import TILE_CANDIDATES, CoefficientFit, fit_coefficients, predict
from simctl.profiler.fit_roofline import calibrate_roofline
from simctl.profiler.profile import PROFILE_FILES
from simctl.profiler.profile_data import check_holdout, load_profile, split_holdout
from simctl.results.output import check_out_dir, json_text, write_files

COST_MODEL_FILE, PLOT_FILE, CALIBRATION_FILE = "cost_model.json", "fit.png", "roofline_calibration.json"
FIT_FILES = (COST_MODEL_FILE, PLOT_FILE, CALIBRATION_FILE)
# an engine whose profile measured more than its steps (meta.json's `engine`) -> the module whose
# `calibrate(fitted, meta) -> (fitted, rows)` adds it: imported only for such a profile, so the generic fit
# knows no engine (vLLM's served steps: `profiler/vllm_served.py`)
CALIBRATORS = {"vllm": "simctl.profiler.vllm_served"}


def fit_profile(profile_dir: str | Path, out: str | Path | None = None, holdout: float = 0.2, seed: int = 0,
                roofline_gpu: str | None = None, memory_bytes: int | None = None, plot: bool = True
                ) -> FitReport:
    """Fit `profile_dir`'s profile; write cost_model.json (+ fit.png, + roofline_calibration.json when
    `roofline_gpu` is given) into `out` (default: the profile folder). InputError on bad input."""
    roofline_gpu = _checked_options(holdout, seed, memory_bytes, roofline_gpu)
    profile_dir = Path(profile_dir)
    df, meta = load_profile(profile_dir)
    _check_profile(profile_dir, df, meta, roofline_gpu)
    out_dir = Path(out) if out is not None else profile_dir
    # fail fast, created on write; beside a profile or an earlier fit only, so that results never mix
    check_out_dir(out_dir, FIT_FILES + (PROFILE_FILES if out_dir.resolve() == profile_dir.resolve() else ()))

    rows = _Rows.split(df, holdout, seed)
    cf = fit_coefficients(df[rows.train])
    pred = predict(cf, df)
    ho, tr = rows.errors(pred)
    mem = memory_bytes if memory_bytes is not None else _profiled_memory(meta)
    fit_info = {"profile": str(profile_dir), **rows.to_json(holdout, seed), **_fit_json(cf, ho, tr)}
    fitted, served = calibrate(_fitted(cf, meta, mem, fit_info), meta)
    if served:
        fitted.fit["served"] = served
    report = FitReport(profile_dir, meta["model"], _device(meta), cf.tile, cf.coefficients, cf.curves,
                       cf.stderr, ho, tr, cf.tile_errors, cf.not_covered, len(df), int(rows.train.sum()),
                       int(rows.held.sum()), out_dir / COST_MODEL_FILE, served=served,
                       step_overheads=fitted.step_overheads)
    files = {COST_MODEL_FILE: _text(json_text(fitted.to_json()))}
    if roofline_gpu is not None:
        cal = _calibrate_roofline(df, rows, meta, roofline_gpu, cf.tile, out_dir / CALIBRATION_FILE)
        files[CALIBRATION_FILE] = _text(json_text(_calibration_json(cal, meta, profile_dir)))
        report.roofline = cal
    if plot:
        report.plot_path = out_dir / PLOT_FILE
        files[PLOT_FILE] = lambda path: fit_figure(path, df, pred, rows.held, fitted, report)
    _write_fit(out_dir, files)
    return report


def calibrate(fitted: Fitted, meta: dict[str, Any]) -> tuple[Fitted, list[dict[str, float]]]:
    """`fitted` calibrated by its profile's engine's calibrator (`CALIBRATORS`), with one row per calibrated
    step for the report; as is, with none, for an engine without one (simctl's own profiles)."""
    engine = meta.get("engine")
    module = CALIBRATORS.get(engine) if isinstance(engine, str) else None
    if module is None:
        return fitted, []
    return importlib.import_module(module).calibrate(fitted, meta)


def _checked_options(holdout: float, seed: int, memory_bytes: int | None, roofline_gpu: str | None
                     ) -> str | None:
    """InputError for a bad option; the catalogue's name of `roofline_gpu`."""
    check_holdout(holdout)
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise InputError(f"seed must be an integer >= 0, got {seed!r}")
    if memory_bytes is not None and not (isinstance(memory_bytes, (int, float)) and memory_bytes > 0):
        raise InputError(f"memory_bytes must be > 0, got {memory_bytes!r}")
    return get_gpu(roofline_gpu).name if roofline_gpu is not None else None  # fail fast on an unknown name


def _check_profile(profile_dir: Path, df: pd.DataFrame, meta: dict[str, Any], roofline_gpu: str | None
                   ) -> None:
    """InputError for a profile the fit cannot price every iteration from, or a calibration for another
    device than the profile's."""
    for what, present in (("prefill", df["num_segments"] > 0), ("decode", df["decode_rows"] > 0)):
        if not present.any():
            raise InputError(f"profile {profile_dir}: no iteration has {what} rows, so the fit could not "
                             "price them (they would cost nothing); profile again with the full or quick "
                             "grid")
    if roofline_gpu is not None and measured_on(meta) not in (None, roofline_gpu):
        raise InputError(f"--roofline-gpu {roofline_gpu}: the profile was measured on "
                         f"{meta.get('device_name') or meta.get('device')}, and a calibration relates its "
                         f"times to the specs of that device: use --roofline-gpu {measured_on(meta)}")


@dataclass(frozen=True)
class _Rows:
    """The profile's rows split into training and held-out rows."""

    kinds: np.ndarray
    held: np.ndarray
    measured: np.ndarray  # seconds

    @classmethod
    def split(cls, df: pd.DataFrame, holdout: float, seed: int) -> _Rows:
        kinds = df["kind"].to_numpy()
        return cls(kinds, split_holdout(kinds, holdout, seed), df["time_s"].to_numpy(dtype=np.float64))

    @property
    def train(self) -> np.ndarray:
        return ~self.held

    def errors(self, predicted: np.ndarray) -> tuple[dict[str, ErrorStats], dict[str, ErrorStats]]:
        """The errors of a prediction of every row: on the held-out rows, and on the training rows."""
        held, train = self.held, self.train
        return (error_stats(self.kinds[held], predicted[held], self.measured[held]),
                error_stats(self.kinds[train], predicted[train], self.measured[train]))

    def to_json(self, holdout: float, seed: int) -> dict[str, Any]:
        return {"rows": len(self.kinds), "train_rows": int(self.train.sum()),
                "holdout_rows": int(self.held.sum()), "holdout": holdout, "seed": seed}


def _fit_json(cf: CoefficientFit, ho: dict[str, ErrorStats], tr: dict[str, ErrorStats]) -> dict[str, Any]:
    """What cost_model.json records of the fit besides its rows: tiles tried, coefficients not covered,
    standard errors (null: not identifiable) and the errors."""
    return {
        "tile_candidates": list(TILE_CANDIDATES),
        "tile_train_rms": {str(t): e for t, e in cf.tile_errors.items()},
        "not_covered": cf.not_covered,
        "coefficient_stderr": {k: (v if math.isfinite(v) else None) for k, v in cf.stderr.items()},
        "errors": _errors_json(ho, tr),
    }


def _errors_json(ho: dict[str, ErrorStats], tr: dict[str, ErrorStats]) -> dict[str, Any]:
    return {"holdout": {k: s.to_json() for k, s in ho.items()},
            "train": {k: s.to_json() for k, s in tr.items()}}


def _profiled_memory(meta: dict) -> float | None:
    """The profiled device's memory in bytes, as the profile recorded it (older profiles: another key)."""
    for key in ("memory_bytes", "device_memory_bytes"):
        v = meta.get(key)
        if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
            return v
    return None


def _device(meta: dict[str, Any]) -> str:
    return str(meta.get("device_name") or meta.get("device") or "unknown device")


def _fitted(cf: CoefficientFit, meta: dict[str, Any], memory_bytes: float | None, fit_info: dict[str, Any]
            ) -> Fitted:
    """The cost model: the fitted form, the profiled model and device, and the executor whose times these
    are (`ExecutorConfig.of_record` reads a profile from before it was recorded)."""
    executor = ExecutorConfig.of_record(meta).record(str(meta.get("device", "cpu")))
    return Fitted(cf.coefficients, cf.tile, cf.curves, model=meta["model"], model_shape=meta["model_shape"],
                  dtype_bytes=dtype_bytes_of(meta["dtype"]), memory_bytes=memory_bytes,
                  meta={**{k: v for k, v in meta.items() if k not in ("model", "model_shape")},
                        "executor_config": executor}, fit=fit_info)


def _calibrate_roofline(df: pd.DataFrame, rows: _Rows, meta: dict[str, Any], gpu: str, tile: int, path: Path
                        ) -> RooflineCalibration:
    """The roofline's efficiencies on `gpu` fitted to the training rows, with its errors."""
    params, at_bound, predicted = calibrate_roofline(df, rows.train, meta, gpu, tile)
    return RooflineCalibration(gpu, params, tile, at_bound, *rows.errors(predicted), path)


def _calibration_json(cal: RooflineCalibration, meta: dict[str, Any], profile_dir: Path) -> dict[str, Any]:
    """roofline_calibration.json (`costs/calibration.py` reads it)."""
    return {
        "format": CALIBRATION_FORMAT, "version": 2, "gpu": cal.gpu, "measured_on": cal.gpu,
        "model": meta["model"],
        "dtype_bytes": dtype_bytes_of(meta["dtype"]), "tile": cal.tile, "params": cal.params,
        "note": "Roofline(model, gpu, mfu=, mbu=, attn_mfu=, overhead_s=) fitted to the profile; "
                "attn_mbu = mbu",
        "at_bound": cal.at_bound, "profile": str(profile_dir), "device": _device(meta),
        "errors": _errors_json(cal.holdout, cal.train),
    }


def _text(text: str) -> Callable[[Path], Any]:
    return lambda path: path.write_text(text, encoding="utf-8")


def _write_fit(out_dir: Path, files: dict[str, Callable[[Path], Any]]) -> None:
    """Write the fit's files, all or none, and remove an earlier fit's file this fit does not replace (it
    would pass for this fit's)."""
    write_files(out_dir, files, "the fit")
    for name in FIT_FILES:
        if name not in files:
            (out_dir / name).unlink(missing_ok=True)
