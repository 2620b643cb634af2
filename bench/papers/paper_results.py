"""What every study of bench/papers/ writes the same way: a prediction's ratio to the published number (a miss
outside 25%, issue 38's target), the misses' causes as a section, and the results file, printed too. The
studies import it as a sibling module (each runs as `python bench/papers/NAME.py`)."""

from __future__ import annotations

from pathlib import Path

from simctl.results.output import atomic_write

RESULTS = Path(__file__).resolve().parents[1] / "results" / "papers"
TOLERANCE = 0.25


def ratio(pred: float, paper: float) -> str:
    """`pred / paper`, marked a miss outside the tolerance."""
    r = pred / paper
    return f"{r:.2f}" + ("" if abs(r - 1) <= TOLERANCE else " miss")


def misses_section(misses: list[str]) -> list[str]:
    return ["## What the misses come from", "", *(f"- {m}" for m in misses), ""]


def publish(name: str, lines: list[str]) -> None:
    """Print the study's Markdown and write it, whole or not at all, to bench/results/papers/NAME.md."""
    text = "\n".join(lines) + "\n"
    print(text)
    RESULTS.mkdir(parents=True, exist_ok=True)
    atomic_write(RESULTS / f"{name}.md", lambda t: t.write_text(text, encoding="utf-8"))
