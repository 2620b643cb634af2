"""What a validation validates: a real engine serving a workload, beside its simulated twin.

A target is started once (`with target:`; simctl's engine starts a child per run, and its start only probes
the device the runs will find; vLLM's engine starts once and serves every run), says the settings it
resolved (which configure its twin), prices a run of a load's workload (its rate, or with closed-loop clients
its concurrency) on its twin (the capacity search's probes), and serves it for real. `validation.pipeline`
runs the stages over any target: simctl's engine, lone or its P/D pair (`validation/engine_target.py`), and
the installed vLLM (`validation/vllm_validate.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, Self

from simctl.traces.workload import Workload


@dataclass(frozen=True)
class ServedRun:
    """A real run: its summary; the machine's speed during it against the one the cost model was fitted on
    (its busy time over the fit's price of its steps; None where the target measures it when the runs are
    compared, as simctl's engine does from its replayed iterations, or no step counted); and the share of the
    machine other processes used meanwhile (None: not measured)."""

    summary: dict[str, Any]
    speed: float | None = None
    foreign_share: float | None = None


class Target(Protocol):
    """A real engine a validation serves on, and its twin."""

    # an engine started once serves its first runs slower: a run at the last load is served and discarded
    # before the rounds (vLLM's); a child per run starts afresh each time (simctl's)
    warm_up: bool

    def __enter__(self) -> Self:
        """Start the engine (or check that it can start); InputError when it cannot serve this workload."""

    def __exit__(self, *exc: object) -> None:
        """Stop it."""

    def settings(self) -> dict[str, Any]:
        """The settings the started engine resolved, as recorded in the report."""

    def folder(self, policy: str) -> str:
        """The folder under `runs/` and `capacity/` for `policy`'s runs ("" for an engine of one policy)."""

    def twin(self, policy: str, workload: Workload) -> dict[str, Any]:
        """The twin's summary of a run of `policy` serving `workload`, as the real run would be served."""

    def serve(self, policy: str, workload: Workload, out: Path | None) -> ServedRun:
        """A real run of `policy` serving `workload`, its files written to `out` (None: a run to discard)."""
