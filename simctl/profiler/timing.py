"""Wall-clock timing of one callable on a device: warm-ups, then repetitions, each timed on its own; and a
monitor of the CPU time the rest of the machine uses meanwhile.

On CUDA every repetition is bracketed by CUDA events recorded on the current stream and the device is
synchronised before reading them (kernels run asynchronously: a host clock would time the launches). On the
CPU `time.perf_counter` brackets each call. Summaries give the median (the estimate), the mean and the
10th/90th percentiles; a shared machine's contended stretches are kept out before, by the blocks' CPU
monitor (below).

`CpuMonitor` tells a block of repetitions timed on an otherwise idle machine from one timed while other
processes ran. On a small shared machine that is the dominant error, and it is not one-sided: on the 2-core
VM this was written on, a process busy on one core made a 2-thread forward pass of 128 tokens ~15% slower
(the OpenMP team waits for a preempted thread) but one of 2 tokens ~40% *faster* (the other vCPU is awake
and answers the wake-up of the second thread at once instead of from a halt) -- no statistic of the
contaminated samples recovers the idle machine's time, so the profiler keeps only blocks timed while the
rest of the machine was idle (see `profiler/worker.py`). It reads Linux /proc: the machine's busy time
(/proc/stat: user, nice, system, irq, softirq, steal) minus this process's (/proc/self/stat: utime + stime),
both in clock ticks from the same tick accounting, so it sees every other process, even one that starts and
ends within the block. Elsewhere it reports nothing (every block counts as quiet).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import torch


def _is_cuda(device: str | torch.device) -> bool:
    return str(getattr(device, "type", device)).startswith("cuda")


def time_fn(fn: Callable[..., Any], warmup: int, reps: int, device: str | torch.device = "cpu",
            setup: Callable[[], Any] | None = None) -> list[float]:
    """Seconds taken by each of `reps` calls of `fn`, after `warmup` untimed calls. With `setup`, each call
    (warm-ups too) is `fn(setup())`, `setup` untimed: the profiler's next repetition of a shape."""
    if reps < 1 or warmup < 0:
        raise ValueError(f"need reps >= 1 and warmup >= 0, got {reps}, {warmup}")
    args: Callable[[], tuple[Any, ...]] = (lambda: (setup(),)) if setup is not None else tuple
    if _is_cuda(device):
        import torch

        for _ in range(warmup):
            fn(*args())
        torch.cuda.synchronize(device)
        times = []
        for _ in range(reps):
            a = args()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*a)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1e3)  # ms -> s
        return times
    for _ in range(warmup):
        fn(*args())
    times = []
    for _ in range(reps):
        a = args()
        t0 = time.perf_counter()
        fn(*a)
        times.append(time.perf_counter() - t0)
    return times


def summarise_times(times: list[float]) -> dict[str, float]:
    """The median of `times` (`time_s`, the estimate), their mean and 10th / 90th percentiles (linear
    interpolation)."""
    a = np.asarray(times, dtype=float)
    p10, med, p90 = np.percentile(a, [10, 50, 90])
    return {"time_s": float(med), "time_mean_s": float(a.mean()), "time_p10_s": float(p10),
            "time_p90_s": float(p90)}


def adaptive_reps(estimate_s: float, budget_s: float, min_reps: int, max_reps: int) -> int:
    """Repetitions that fit `budget_s` given one call takes about `estimate_s`, within [min_reps,
    max_reps]."""
    if estimate_s <= 0:
        return max_reps
    return int(min(max_reps, max(min_reps, budget_s // estimate_s)))


class CpuMonitor:
    """CPU time used by everything but this process (and the processes `own` names: a child doing the timed
    work) between two `read()`s (Linux /proc; elsewhere nothing).

        mon = CpuMonitor()
        r0 = mon.read(); ...timed block...; r1 = mon.read()
        share = mon.foreign_share(r0, r1, wall_s)   # other processes' CPU time / the machine's capacity
    """

    def __init__(self, own: tuple[int, ...] = ()) -> None:
        self.available = False
        self.cpus = 1
        self.hz = 100
        self._own: list[int] = []
        try:
            self._stat = os.open("/proc/stat", os.O_RDONLY)
            self._self = os.open("/proc/self/stat", os.O_RDONLY)
            self._own = [os.open(f"/proc/{pid}/stat", os.O_RDONLY) for pid in own]
            with open("/proc/stat", encoding="ascii") as f:
                self.cpus = max(1, sum(1 for line in f if line.startswith("cpu") and line[3:4].isdigit()))
            self.hz = int(os.sysconf("SC_CLK_TCK"))
            self.read()
            self.available = True
        except (OSError, ValueError, IndexError, AttributeError):
            self.available = False

    def read(self) -> tuple[int, int]:
        """(machine busy ticks, this process's ticks); (0, 0) when unavailable."""
        if not getattr(self, "_stat", None):
            return 0, 0
        v = [int(x) for x in os.pread(self._stat, 512, 0).split(b"\n", 1)[0].split()[1:9]]
        busy = v[0] + v[1] + v[2] + v[5] + v[6] + v[7]  # user nice system (idle iowait) irq softirq steal
        return busy, sum(_process_ticks(fd) for fd in (self._self, *self._own))

    def foreign_ticks(self, before: tuple[int, int], after: tuple[int, int]) -> int:
        return max(0, (after[0] - before[0]) - (after[1] - before[1])) if self.available else 0

    def foreign_share(self, before: tuple[int, int], after: tuple[int, int], wall_s: float) -> float:
        """Other processes' CPU time over the machine's capacity (cpus x wall) between the two reads, at most
        1: ticks are whole, so a block shorter than a tick can count more than its wall (seen on a loaded
        machine)."""
        if not self.available or wall_s <= 0:
            return 0.0
        return min(1.0, self.foreign_ticks(before, after) / (self.hz * self.cpus * wall_s))

    def quiet(self, before: tuple[int, int], after: tuple[int, int], wall_s: float, share: float) -> bool:
        """True if the rest of the machine used at most `share` of its capacity (plus one tick: the tick
        accounting samples the running task, so a short block can see one stray tick)."""
        if not self.available:
            return True
        return self.foreign_ticks(before, after) <= 1 + share * self.hz * self.cpus * wall_s

    def close(self) -> None:
        for name in ("_stat", "_self"):
            fd = getattr(self, name, None)
            if fd:
                os.close(fd)
                setattr(self, name, None)
        for fd in self._own:
            os.close(fd)
        self._own = []
        self.available = False


def _process_ticks(fd: int) -> int:
    """A process's CPU ticks from its open /proc/PID/stat: utime + stime (fields 14, 15)."""
    f = os.pread(fd, 2048, 0).rsplit(b")", 1)[1].split()
    return int(f[11]) + int(f[12])
