"""How busy the machine was while a real run ran (other processes' CPU share), and waiting for a quiet moment
before one starts: on a shared VM the same run moves by x1.1-x2.4 from one run to the next."""

from __future__ import annotations

import time


class LoadMeter:
    """Other processes' share of the machine's CPU between `start()` and `stop()` (Linux /proc/stat; None
    elsewhere): machine busy time minus this process's and its waited-for children's (the serving child)."""

    def __init__(self) -> None:
        import os

        self.hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cpus = os.cpu_count() or 1
        self.t0: tuple[float, float, float] | None = None

    def _read(self) -> tuple[float, float, float] | None:
        import os

        try:
            with open("/proc/stat", encoding="ascii") as f:
                v = [int(x) for x in f.readline().split()[1:9]]
        except (OSError, ValueError):
            return None
        t = os.times()
        own = t.user + t.system + t.children_user + t.children_system
        return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / self.hz, own, time.perf_counter()

    def start(self) -> None:
        self.t0 = self._read()

    def stop(self) -> float | None:
        t1 = self._read()
        if self.t0 is None or t1 is None or t1[2] <= self.t0[2]:
            return None
        foreign = (t1[0] - self.t0[0]) - (t1[1] - self.t0[1])
        return max(0.0, foreign) / (self.cpus * (t1[2] - self.t0[2]))



def wait_quiet(max_wait_s: float, share: float = 0.15, window_s: float = 1.0) -> tuple[float, float | None]:
    """Wait, up to `max_wait_s`, for a `window_s` window in which other processes use at most `share` of the
    machine; returns (seconds waited, their share in the last window)."""
    meter, waited, last = LoadMeter(), 0.0, None
    while waited < max_wait_s:
        meter.start()
        time.sleep(window_s)
        last = meter.stop()
        waited += window_s
        if last is None or last <= share:
            break
    return waited, last



def loadavg() -> list[float] | None:
    import os

    try:
        return [round(v, 2) for v in os.getloadavg()]
    except (OSError, AttributeError):
        return None

