"""simctl's own engine as a validation target (`validation.target.Target`): each real run a child process
(`engine.real.real_main`; with a prefill and a decode instance, its P/D pair, `engine.disagg`), its twin the
simulator on the run's requests and KV sizing (`validation.twin`), priced by the fitted cost model."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Self

from simctl.costs.base import CostModel
from simctl.costs.provenance import check_fitted_run
from simctl.traces.workload import Workload
from simctl.validation.machine_load import LoadMeter, wait_quiet
from simctl.validation.target import ServedRun
from simctl.validation.twin import Setup, simulate_twin, twin_summary

BUSY_SHARE = 0.15  # other processes' share of the machine above which a real run is said to run on a busy one


@dataclass
class SimctlEngine:
    """simctl's engine on `setup` for `policies`, its twin priced by `fitted`. `quiet_wait_s`: before each
    run, wait up to this long for a second in which other processes use at most `BUSY_SHARE` of the
    machine."""

    setup: Setup
    fitted: CostModel
    policies: list[str]
    say: Callable[[str], None] = lambda _msg: None
    quiet_wait_s: float = 0.0
    meter: LoadMeter = field(default_factory=LoadMeter)
    device_name: str | None = None  # the device's, once started
    warm_up: bool = False  # a child per run: none starts warm

    def __enter__(self) -> Self:
        """Probe the device as the real runs will find it (on cuda a child builds the model, and cuda missing
        fails here) and size the twins on the KV slab budget the runs will use."""
        from simctl.engine.real import probe_device

        probe = probe_device(self.setup.real_config(self.policies[0], 1.0))
        check_fitted_run(getattr(self.fitted, "meta", {}), probe.device, probe.device_name, self.setup.dtype)
        self.setup = replace(self.setup, device=probe.device, kv_budget_bytes=probe.kv_budget_bytes)
        self.device_name = probe.device_name
        self.say(f"real runs on {probe.device_name} ({probe.device}, {self.setup.dtype}), KV slab budget "
                 f"{probe.kv_budget_bytes / 2**30:.3g} GiB")
        for p in self.policies:
            twin_summary(self.setup, p, 1.0)  # sizing: every request fits the model and the KV slab
        return self

    def __exit__(self, *exc: object) -> None:
        pass  # each run's child ended with it

    def settings(self) -> dict[str, Any]:
        return {**self.setup.recorded(), "device_name": self.device_name}

    def folder(self, policy: str) -> str:
        return policy

    def twin(self, policy: str, workload: Workload) -> dict[str, Any]:
        return simulate_twin(twin_summary(replace(self.setup, workload=workload), policy, workload.qps),
                             self.fitted)[0]

    def serve(self, policy: str, workload: Workload, out: Path | None) -> ServedRun:
        """A real run (a child process) and the share of the machine other processes used meanwhile; its
        speed is measured when compared, from its replayed iterations (`validation.compare`)."""
        from simctl.engine.real import real_main

        setup = self.setup
        if self.quiet_wait_s > 0:
            waited, share = wait_quiet(self.quiet_wait_s, BUSY_SHARE)
            if share is not None and share > BUSY_SHARE:
                self.say(f"  the machine is busy ({share:.0%} of it used by other processes after "
                         f"{waited:.0f} s); running anyway")
        self.meter.start()
        s = real_main(workload=workload, model=setup.model, dtype=setup.dtype,
                      threads=setup.threads, device=setup.device, kv_budget_bytes=setup.kv_budget_bytes,
                      attention=setup.attention, eager=setup.eager, prefill_instances=setup.prefill_instances,
                      decode_instances=setup.decode_instances, policy=policy, out=out)
        return ServedRun(s, None, self.meter.stop())
