"""The machine-speed probe of a vLLM validation (`validation/vllm_validate.py`): its reference is the fit's
own served measurement, when the fit has one."""

from __future__ import annotations

from pathlib import Path

import pytest

from costs.fitted import Fitted
from validation.vllm_validate import SPEED_BATCHES, served_reference

pytestmark = pytest.mark.unit

SHIPPED = Path(__file__).resolve().parents[1] / "profiler" / "profiles" / "cpu" / "cost_model.json"


def _fit_with(served: list[dict]) -> Fitted:
    data = Fitted.load(SHIPPED).to_json()
    data["fit"] = {**data.get("fit", {}), "served": served}
    return Fitted.from_json(data)


def test_the_reference_is_the_fits_served_periods_in_seconds() -> None:
    rows = [{"batch": b, "served_ms": 0.5 * b} for b in (1, *SPEED_BATCHES, 128)]
    assert served_reference(_fit_with(rows)) == {b: pytest.approx(0.5e-3 * b) for b in SPEED_BATCHES}


def test_without_every_probe_batch_there_is_no_reference() -> None:
    assert served_reference(_fit_with([{"batch": SPEED_BATCHES[0], "served_ms": 3.0}])) == {}
    assert served_reference(_fit_with([{"batch": b, "served_ms": 0.0} for b in SPEED_BATCHES])) == {}
    assert served_reference(Fitted.load(SHIPPED)) == {}  # the shipped CPU fit of simctl's engine
