"""Wall-clock timing of one callable on a device: warm-ups, then repetitions, each timed on its own.

On CUDA every repetition is bracketed by CUDA events recorded on the current stream and the device is
synchronised before reading them (kernels run asynchronously: a host clock would time the launches). On the
CPU `time.perf_counter` brackets each call. Summaries use medians and the 10th/90th percentiles, which
resist the outliers of a shared, noisy machine.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np


def _is_cuda(device: Any) -> bool:
    return str(getattr(device, "type", device)).startswith("cuda")


def time_fn(fn: Callable[[], Any], warmup: int, reps: int, device: Any = "cpu") -> list[float]:
    """Seconds taken by each of `reps` calls of `fn`, after `warmup` untimed calls."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got {reps}, {warmup}")
    if _is_cuda(device):
        import torch

        for _ in range(warmup):
            fn()
        torch.cuda.synchronize(device)
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # ms -> s
        return times
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def summarize(times: list[float]) -> dict[str, float]:
    """Median and 10th / 90th percentiles (linear interpolation) of `times`."""
    a = np.asarray(times, dtype=float)
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return {"time_s": float(med), "time_p10_s": float(p10), "time_p90_s": float(p90)}


def adaptive_reps(estimate_s: float, budget_s: float, min_reps: int, max_reps: int) -> int:
    """Repetitions that fit `budget_s` given one call takes about `estimate_s`, within [min_reps, max_reps]."""
    if estimate_s <= 0:
        return max_reps
    return int(min(max_reps, max(min_reps, budget_s // estimate_s)))
