"""A roofline calibration: efficiencies (mfu, mbu, attention mfu, overhead) measured on one device by
`simctl fit --roofline-gpu`, applied to another GPU's published specs (`--cost roofline_calibration.json`)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from simctl.common.errors import InputError

ROOFLINE_PARAMS: tuple[str, ...] = ("mfu", "mbu", "attn_mfu", "overhead_s")
CALIBRATION_FORMAT = "simctl.roofline-calibration"


def is_roofline_calibration(path: str | Path) -> bool:
    """Whether the file declares itself a roofline calibration (any other file is tried as a fitted model)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8")).get("format") == CALIBRATION_FORMAT
    except (OSError, ValueError, AttributeError):
        return False  # Fitted.load reports what is wrong with the file


def load_roofline_calibration(path: str | Path) -> dict[str, float]:
    """Keyword arguments for `Roofline(model, gpu, **kwargs)` from a roofline_calibration.json."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"roofline calibration {path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise InputError(f"roofline calibration {path}: cannot read ({e})") from None
    if not isinstance(data, dict) or data.get("format") != CALIBRATION_FORMAT:
        raise InputError(f"roofline calibration {path}: not a roofline calibration "
                         f"(format {CALIBRATION_FORMAT})")
    params = data.get("params")
    if not isinstance(params, dict):
        raise InputError(f"roofline calibration {path}: missing key 'params'")
    out = {}
    for k in ROOFLINE_PARAMS:
        v = params.get(k)
        ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
        if not ok or v < 0 or (k != "overhead_s" and not 0 < v <= 1):
            raise InputError(f"roofline calibration {path}: params.{k} = {v!r} is missing or out of range")
        out[k] = float(v)
    return {**out, "request_s": 0.0}  # fitted without one: overhead_s holds all of the host's time
