"""What `simctl fit` produces: the error statistics (per kind of row: `error_stats`), the roofline calibration
and the fit report."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simctl.costs.curves import CurveTables
from simctl.costs.overheads import StepOverheads


@dataclass(frozen=True)
class ErrorStats:
    """Absolute percentage errors of one group of rows, as fractions (0.01 = 1%)."""

    n: int
    mape: float
    p95: float

    @classmethod
    def of(cls, predicted: np.ndarray, measured: np.ndarray) -> ErrorStats:
        """MAPE and P95 absolute percentage error of `predicted` against `measured` (non-empty)."""
        ape = np.abs(predicted - measured) / measured
        return cls(len(ape), float(ape.mean()), float(np.percentile(ape, 95)))

    def to_json(self) -> dict[str, float]:
        return {"n": self.n, "mape": self.mape, "p95_ape": self.p95}


def error_stats(kinds: np.ndarray, predicted: np.ndarray, measured: np.ndarray) -> dict[str, ErrorStats]:
    """`ErrorStats` per kind and "overall" (kinds with no rows are left out)."""
    out = {kind: ErrorStats.of(predicted[kinds == kind], measured[kinds == kind])
           for kind in sorted(set(kinds.tolist()))}
    if len(measured):
        out["overall"] = ErrorStats.of(predicted, measured)
    return out


@dataclass
class RooflineCalibration:
    gpu: str
    params: dict[str, float]  # mfu, mbu (= attn_mbu), attn_mfu, overhead_s
    tile: int
    at_bound: list[str]
    holdout: dict[str, ErrorStats]
    train: dict[str, ErrorStats]
    path: Path | None = None


@dataclass
class FitReport(CurveTables):
    profile_dir: Path
    model: str
    device: str
    tile: int
    coefficients: dict[str, float]
    # knot tables (n, seconds) by name, as `simctl.costs.fitted_form.CURVES`
    curves: dict[str, list[tuple[int, float]]]
    stderr: dict[str, float]  # linearised standard error of each coefficient (inf: not identifiable)
    holdout: dict[str, ErrorStats]  # per kind and "overall"; empty when holdout=0
    train: dict[str, ErrorStats]
    tile_errors: dict[int, float]  # training RMS relative error of the best fit at each candidate tile
    not_covered: list[str]
    rows: int
    train_rows: int
    holdout_rows: int
    cost_model_path: Path
    plot_path: Path | None = None
    roofline: RooflineCalibration | None = None
    # a vLLM profile's served-mode calibration (`profiler/vllm_served.py`): its steps and the host terms
    served: list[dict[str, float]] = field(default_factory=list)
    step_overheads: StepOverheads | None = None

