"""The link that carries KV caches from prefill to decode instances: one transfer at a time, first come first
served (a transfer ready while another is on the link waits for it), each taking bytes / bandwidth."""

from __future__ import annotations

import math
from array import array

from simctl.common.errors import InputError


def kv_transfer_bytes(kv_bytes_per_token: int, prompt_tokens: int) -> int:
    """A prefilled request's KV: 2 (K, V) x layers x KV heads x head dim x dtype bytes per prompt token."""
    return kv_bytes_per_token * prompt_tokens


class KVLink:
    def __init__(self, gbps: float) -> None:
        if (isinstance(gbps, bool) or not isinstance(gbps, int | float)
                or not (gbps > 0 and math.isfinite(gbps))):
            raise InputError(
                f"--kv-link-gbps must be a finite number > 0 (gigabits per second), got {gbps!r}")
        self.gbps = float(gbps)
        self.bytes_per_s = self.gbps * 1e9 / 8
        self.free_at = 0.0
        # per transfer: when its KV was ready, when it went on the link, when it arrived
        self.ready = array("d")
        self.start = array("d")
        self.end = array("d")
        self.bytes = 0

    def transfer(self, ready: float, nbytes: int) -> float:
        """Send `nbytes` ready at `ready` (calls come in order of `ready`); return when they have arrived."""
        start = max(ready, self.free_at)
        end = self.free_at = start + nbytes / self.bytes_per_s
        self.record(ready, start, end, nbytes)
        return end

    def record(self, ready: float, start: float, end: float, nbytes: int) -> None:
        """Log a transfer (one this link priced, or one a real link measured)."""
        self.ready.append(ready)
        self.start.append(start)
        self.end.append(end)
        self.bytes += nbytes
