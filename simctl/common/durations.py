"""A time limit as a user writes it: a number in the option's own unit, or with an explicit unit (`100ms`,
`0.1s`), so that options whose plain numbers differ in unit (`--slo` takes seconds, as results.slo's keys
do; `--goodput` milliseconds, as vLLM's bench does) read the same with a unit given."""

from __future__ import annotations

import re

UNITS = {"s": 1.0, "ms": 1e-3}
_WITH_UNIT = re.compile(r"^(?P<number>.*?)\s*(?P<unit>ms|s)$")


def seconds_of(text: str, default_unit: str) -> float:
    """Seconds of `text`: a number in `default_unit` ("s" or "ms"), or a number followed by "s" or "ms";
    ValueError when it is neither (the caller says which option, in its words)."""
    text = str(text).strip()
    m = _WITH_UNIT.match(text)
    number, unit = (m["number"], m["unit"]) if m else (text, default_unit)
    return float(number) * UNITS[unit]
