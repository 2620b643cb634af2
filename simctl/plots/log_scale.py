"""Log-scaled axes labelled in plain numbers, as the fit's and the validation's figures draw them."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def log_axes(ax: Axes, axes: str = "xy") -> None:
    """Log scale on `axes` ("x", "y" or both) with plain-number labels at 1, 2, 5 x 10^k (no overlapping minor
    labels). matplotlib is imported here, when a figure is drawn: importing the fit must not load it."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    for name in axes:
        axis = ax.xaxis if name == "x" else ax.yaxis
        (ax.set_xscale if name == "x" else ax.set_yscale)("log")
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
        axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        axis.set_minor_formatter(NullFormatter())
