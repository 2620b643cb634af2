"""Real time for the replica loop: the monotonic clock, and sleeping until the loop's next wake-up."""

from __future__ import annotations

import time
from collections.abc import Callable, Generator


class RealTime:
    """Seconds since `start()` on a monotonic clock; `drive` runs a replica loop against it. Waits for an
    iteration's end return at once (the backend has already run it); waits for an arrival sleep."""

    def __init__(self, clock: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep
                 ) -> None:
        self.clock = clock
        self.sleep = sleep
        self.t0 = clock()

    def start(self, at: float | None = None) -> None:
        """Time 0 is now, or the clock's reading `at` (processes sharing a monotonic clock share a start)."""
        self.t0 = self.clock() if at is None else at

    def read(self) -> float:
        return self.clock() - self.t0

    def now(self, exact: float) -> float:
        return self.clock() - self.t0

    def drive(self, loop: Generator[float, None, None]) -> None:
        for until in loop:
            delay = until - (self.clock() - self.t0)
            if delay > 0:
                self.sleep(delay)
