"""How steady this machine is by itself, with nothing of simctl or vLLM running: a fixed in-cache matrix
product (compute: 40 products of 256 x 256 float32, 0.5 MB, within a core's L2) and a fixed memory copy
(bandwidth: 4 copies of 32 MB, the size of this VM's L3) timed back to back for `--seconds`, each sample
over the run's median, summarised per `--window` seconds. A step of the tiny model streams its ~20 MB of
weights, so its time follows the copy's, not the product's.

    .venv/bin/python research/host_noise.py [--seconds 150] [--window 10] [--threads 2]

Writes research/results/host_noise.md.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
PERCENTILES = (5, 25, 50, 75, 95)


def sample(seconds: float) -> np.ndarray:
    """Rows of (monotonic time, product seconds, copy seconds), back to back for `seconds`."""
    import torch

    a, b = torch.randn(256, 256), torch.randn(256, 256)
    src = torch.randn(8_000_000)
    dst = torch.empty_like(src)
    rows, end = [], time.monotonic() + seconds
    while time.monotonic() < end:
        t0 = time.perf_counter()
        for _ in range(40):
            a @ b
        t1 = time.perf_counter()
        for _ in range(4):
            dst.copy_(src)
        rows.append((time.monotonic(), t1 - t0, time.perf_counter() - t1))
    return np.array(rows)


def summary(rows: np.ndarray, window_s: float) -> dict[str, dict[str, list[float]]]:
    """Per probe: percentiles of its samples over their median, and each window's median over it."""
    t = rows[:, 0] - rows[0, 0]
    edges = np.arange(0.0, t[-1] + window_s, window_s)
    out = {}
    for col, name in ((1, "compute"), (2, "memory")):
        x = rows[:, col] / np.median(rows[:, col])
        windows = [float(np.median(x[(t >= lo) & (t < lo + window_s)])) for lo in edges
                   if ((t >= lo) & (t < lo + window_s)).any()]
        out[name] = {"percentiles": [float(v) for v in np.percentile(x, PERCENTILES)], "windows": windows}
    return out


def markdown(s: dict[str, dict[str, list[float]]], samples: int, seconds: float, window_s: float) -> str:
    lines = [f"# This machine's own speed over {seconds:g} s ({samples} samples)", "",
             "Each sample's time over the run's median (higher is slower).", "",
             f"| probe | P5 / P25 / P50 / P75 / P95 | {window_s:g} s windows' medians | windows' max / min |",
             "|---|---|---|---|"]
    for name, v in s.items():
        w = v["windows"]
        lines.append(f"| {name} | {' / '.join(f'{p:.2f}' for p in v['percentiles'])} | "
                     f"{' '.join(f'{x:.2f}' for x in w)} | {max(w) / min(w):.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--window", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    rows = sample(a.seconds)
    text = markdown(summary(rows, a.window), len(rows), a.seconds, a.window)
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    text = text.replace("\n\n", f"\n\nMeasured {when}, {a.threads} torch threads.\n\n", 1)
    (ROOT / "research" / "results" / "host_noise.md").write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
