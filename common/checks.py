"""Type checks of option values, shared by every command that validates its options."""

from __future__ import annotations

import numpy as np


def is_int(v: object) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def is_number(v: object) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool)
