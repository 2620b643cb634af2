"""`simctl plot KIND DIR...`: the figures people read, from the folders of `simctl run`, `capacity`,
`sweep`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from simctl.common.errors import InputError

if TYPE_CHECKING:
    from matplotlib.figure import Figure

FORMATS = ("png", "svg", "pdf")
MAGIC = {"png": (b"\x89PNG",), "svg": (b"<?xml", b"<svg"), "pdf": (b"%PDF",)}


def is_figure(path: Path) -> bool:
    """Whether `path` is a figure matplotlib wrote in its suffix's format (its creator is named in the first
    or, for a PDF, the last few kB): what `plot --out` may replace."""
    from simctl.results.output import file_ends

    head, tail = file_ends(path)
    magic = MAGIC.get(path.suffix.lstrip(".").lower(), ())
    return head.startswith(magic) and b"Matplotlib" in head + tail
KINDS: dict[str, str] = {
    "capacity": "capacity per scheduler under each SLO (capacity or sweep folders)",
    "cdf": "TTFT, TBT and E2E CDFs (run folders)",
    "timeline": "which requests each iteration ran, prefill or decode (a run folder with --timeline)",
    "tbt": "time between tokens over time: generation stalls (run folders)",
    "pareto": "throughput per GPU vs per-user token rate (run, capacity or sweep folders)",
    "attainment": "SLO attainment vs offered rate (capacity or sweep folders)",
}


def parse_window(text: str | None) -> tuple[float, float] | None:
    if text is None:
        return None
    start, sep, end = text.partition(":")
    try:
        window = (float(start) if start.strip() else 0.0, float(end) if end.strip() else float("inf"))
    except ValueError:
        window = None
    if not sep or window is None or not window[0] < window[1]:
        raise InputError(
            f"--window {text!r}: give START:END in simulated seconds with START < END, e.g. 10:40")
    return window


def figure(kind: str, dirs: list[Path], window: tuple[float, float] | None = None) -> Figure:
    """Read the folders (InputError naming what is missing) and draw the figure."""
    from simctl.plots.inputs import load_results, load_run

    if kind in ("cdf", "tbt", "timeline"):
        from simctl.plots.single_run import cdf_figure, tbt_figure, timeline_figure

        runs = [load_run(d) for d in dirs]
        if kind == "timeline":
            if len(runs) != 1:
                raise InputError("the timeline figure draws one run: give one folder")
            return timeline_figure(runs[0], window)
        return cdf_figure(runs) if kind == "cdf" else tbt_figure(runs, window)
    from simctl.plots.across_runs import attainment_figure, capacity_figure, pareto_figure

    caps, points = load_results(dirs)
    if kind == "capacity":
        return capacity_figure(caps)
    return pareto_figure(points) if kind == "pareto" else attainment_figure(points)


def plot(
    kind: Annotated[str, typer.Argument(help="One of: " + "; ".join(f"{k}: {v}" for k, v in KINDS.items()))],
    dirs: Annotated[list[Path], typer.Argument(help="Output folders of simctl run, capacity or sweep.")],
    out: Annotated[Path | None, typer.Option(help="The figure file (.png, .svg or .pdf; an existing "
                                             "file only if it is an earlier figure) [default: KIND.png in "
                                             "the current folder].")] = None,
    window: Annotated[str | None, typer.Option(help="tbt and timeline: only START:END (simulated seconds).")
                      ] = None,
) -> None:
    """Draw a figure from simulation outputs.

    Example: simctl plot capacity out/cap_strict out/cap_relaxed --out capacity.png
    """
    import matplotlib.pyplot as plt
    from rich.console import Console
    from rich.markup import escape

    from simctl.results.output import check_out_file, write_files
    from simctl.usage_errors import note_replaced

    if kind not in KINDS:
        raise InputError(f"unknown figure {kind!r}; known: {', '.join(KINDS)}")
    out = Path(out) if out is not None else Path(f"{kind}.png")
    fmt = out.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise InputError(f"--out {out}: give a .png, .svg or .pdf file")
    if out.is_dir():
        raise InputError(f"--out {out}: is a folder; give a file name such as {out / (kind + '.png')}")
    check_out_file(out, "--out", "figure", is_figure)  # as --out folders: only an earlier figure is replaced
    fig = figure(kind, dirs, parse_window(window))
    note_replaced(out.parent, (out.name,))
    try:
        write_files(out.parent, {out.name: lambda p: fig.savefig(p, dpi=120, format=fmt)}, "the figure")
    finally:
        plt.close(fig)
    Console().print(escape(f"wrote {out}"))
