"""`simctl real`: serve a trace in real time on a real torch model (random weights), driven by the simulator's
own policy objects, and write the simulator's output files with measured timestamps.

    summary = real_main(policy="sarathi", workload=Workload(trace="sharegpt", qps=2, num_requests=30,
                        scale=0.05), model="tiny", device="cpu", out="out/real")

`real_main` runs the serving in a child process (`python -m simctl.engine.worker`) started with
OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS / MKL_NUM_THREADS = threads, as the profiler does: OpenMP reads
them once when torch starts it, so they cannot be set from inside a running process, and with the default
(active) policy idle OpenMP threads spin and steal the cores of a shared machine. `run_real` is the same run
in the calling process (tests, notebooks), where those variables are whatever the process started with; both
record what was in effect.

The configuration, the sizing of the slab and the engine's construction are `engine.setup`'s; serving the
deployment (one engine, or a prefill and a decode instance) is `simctl.engine.deployment`'s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simctl.catalogue.models import is_moe
from simctl.common.errors import InputError
from simctl.engine.setup import (
    DEFAULT_NUM_REQUESTS,
    DEFAULT_QPS,
    REAL_WORKLOAD,
    RealConfig,
    RealRun,
    size_run,
)
from simctl.executor.config import eager_on
from simctl.executor.runtime import default_threads
from simctl.traces.build import has_arrival_times
from simctl.traces.request import Request
from simctl.traces.workload import Workload

if TYPE_CHECKING:
    import torch

CPU_KV_BYTES = 1 << 30  # slab budget on the CPU
GPU_KV_SHARE = 0.5  # share of the free device memory (after the weights) the slab may take


def _device_name(device: torch.device) -> str:
    import torch

    from simctl.executor.runtime import cpu_name

    return torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_name()


def device_kv_budget(device: torch.device) -> int:
    """The KV slab's memory budget on a torch `device` whose model is built: CPU_KV_BYTES on the CPU, on cuda
    GPU_KV_SHARE of the free memory."""
    import torch

    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * GPU_KV_SHARE)
    return CPU_KV_BYTES


@dataclass(frozen=True)
class DeviceProbe:
    """A device as a real run of a config finds it."""

    device: str  # torch's name: cpu, cuda, cuda:N
    device_name: str
    kv_budget_bytes: int  # device_kv_budget once the config's model is built there


def measure_device(config: RealConfig) -> DeviceProbe:
    """Build `config`'s model on its device and measure it (in the probing child); InputError for cuda
    missing."""
    from simctl.catalogue.models import get_model
    from simctl.executor.model import build_model, resolve_device

    device = resolve_device(config.device)
    build_model(get_model(config.model), device, config.dtype, config.workload.seed)
    return DeviceProbe(str(device), _device_name(device), device_kv_budget(device))


def run_real(config: RealConfig, threads_env: bool = False) -> RealRun:
    """Serve `config` in this process and return its records and summary (nothing written)."""
    t_total = time.perf_counter()
    config.validate()
    requests = config.workload.requests()

    import torch
    import transformers

    from simctl.catalogue.models import get_model
    from simctl.engine.deployment import serve_deployment
    from simctl.executor.model import build_model, resolve_device
    from simctl.executor.ragged import attention_kernels

    threads = config.threads if config.threads is not None else default_threads()
    torch.set_num_threads(threads)
    device = resolve_device(config.device)
    spec = get_model(config.model)
    model = build_model(spec, device, config.dtype, config.workload.seed)
    kernels = attention_kernels(model, config.executor)  # InputError, before serving, if a kind has none
    kv_bpt = spec.kv_bytes_per_token(model.dtype.itemsize)
    budget = config.kv_budget_bytes if config.kv_budget_bytes is not None else device_kv_budget(device)
    size = size_run(config, requests, kv_bpt, budget)
    run, served = serve_deployment(config, size, requests, model)
    summary, out, engine = run.summary, run.engine, served.engine
    slab = engine.executor.executor.kv
    summary.update({
        "arrivals_from_file": has_arrival_times(config.workload.trace),
        "gpu": "cpu" if device.type == "cpu" else None,  # the catalogue device to simulate it with, if any
        "tp": 1,
        "device": str(device),
        "device_name": _device_name(device),
        "dtype": config.dtype,
        "executor_config": config.executor.record(str(device)),
        "attention_kernels": kernels,
        "threads": torch.get_num_threads(),
        "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
        "child_process": threads_env,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "max_seq_len": size.max_seq_len,
        "kv_slots": size.kv_slots,
        "kv_slot_tokens": size.kv_slot_tokens,
        "kv_budget_bytes": budget,
        "kv_slab_bytes": int(slab.numel() * slab.element_size()),  # per instance
        "kv_slots_peak": out.peak_slots,
        **engine.policy.settings.as_dict(),  # every setting of the policy, given or default
        "max_batch_size_capped": size.max_batch_size_capped,
        "warmup_s": served.warmup_s,
        "forward_s_total": float(out.forward_s.sum()),
        **served.fields,
        "real_wall_s": time.perf_counter() - t_total,
    })
    return run


def write_real(run: RealRun, out: str | Path) -> None:
    """summary.json, requests.parquet, iterations.parquet and replicas.parquet, as `simctl run` writes
    them."""
    from simctl.results.output import write_cluster_files

    write_cluster_files(Path(out), run.summary, run.result.requests, run.iterations, run.replicas)


# ---- the child process -------------------------------------------------------------------------------------


def worker_command(config: RealConfig, out: Path | None, result_path: Path, probe: bool = False) -> list[str]:
    return [sys.executable, "-m", "simctl.engine.worker", "--config", json.dumps(asdict(config)),
            "--result", str(result_path)] + (["--out", str(out)] if out is not None else []) + (
            ["--probe"] if probe else [])


def _run_worker(config: RealConfig, out: Path | None = None, probe: bool = False) -> dict[str, Any]:
    """Run the worker child on `config` and return its "done" message; InputError for its input errors,
    RuntimeError (one line: why) if it crashed. Interrupted, the child is stopped within a bounded wait."""
    from simctl.common.children import failure_line, stop
    from simctl.executor.runtime import worker_env

    with tempfile.TemporaryDirectory() as tmp, tempfile.TemporaryFile(mode="w+", encoding="utf-8",
                                                                     errors="replace") as err:
        result_path = Path(tmp) / "result.json"
        proc = subprocess.Popen(worker_command(config, out, result_path, probe),
                                env=worker_env(config.threads), stdin=subprocess.DEVNULL, stdout=err,
                                stderr=err)
        try:
            proc.wait()
        finally:
            stop(proc)
        msg = json.loads(result_path.read_text(encoding="utf-8")) if result_path.is_file() else None
        if msg is not None and msg.get("event") == "error" and msg.get("input"):
            raise InputError(msg["message"])
        if proc.returncode != 0 or msg is None or msg.get("event") != "done":
            err.seek(0)
            raise RuntimeError(failure_line("real-execution worker", proc.returncode,
                                            msg.get("message") if msg else None, err.read()))
    return msg


def check_memory(config: RealConfig, requests: list[Request]) -> None:
    """Before the child builds anything: sizing errors (a request longer than the model or the KV capacity),
    and the model, its KV slab and a prefill of the longest prompt against the device's memory, for each
    instance (InputError). On cuda without a budget given the slab takes a share of what the weights leave
    (`device_kv_budget`): one slot is counted. On cuda with a budget given, that budget was measured on the
    device by a child that built the model (`probe_device`, once per validation): it fits, and the device is
    not asked again for every run."""
    from simctl.catalogue.models import get_model
    from simctl.executor.memory import DTYPE_BYTES, check_fits

    spec = get_model(config.model)
    kv_bpt = spec.kv_bytes_per_token(DTYPE_BYTES[config.dtype])
    on_cpu = str(config.device).lower() == "cpu"
    budget = config.kv_budget_bytes or (CPU_KV_BYTES if on_cpu else None)
    size = size_run(config, requests, kv_bpt, 1 << 62 if budget is None else budget)
    if budget is not None and not on_cpu:
        return
    kv_tokens = size.kv_slot_tokens * (1 if budget is None else size.kv_slots)
    check_fits(spec, config.dtype, kv_tokens, max(r.prompt_tokens for r in requests), config.device,
               instances=2 if config.disaggregated else 1)


def probe_device(config: RealConfig) -> DeviceProbe:
    """The device of `config` as its real runs will find it: on cuda measured in a child (as `real_main` runs,
    so that this process never holds a CUDA context); InputError if cuda is missing."""
    from simctl.executor.runtime import cpu_name

    check_memory(config, config.workload.requests())
    if str(config.device).lower() == "cpu":
        return DeviceProbe("cpu", cpu_name(), CPU_KV_BYTES)
    threads = config.threads if config.threads is not None else default_threads()
    return DeviceProbe(**_run_worker(replace(config, threads=threads), probe=True)["probe"])


def real_main(*, policy: str = "sarathi", workload: Workload = REAL_WORKLOAD, model: str = "tiny",
              device: str = "cpu", out: str | Path | None = None, dtype: str = "float32",
              threads: int | None = None, options: dict[str, Any] | None = None,
              kv_capacity: int | None = None, attention: str = "auto", eager: bool | None = None,
              kv_budget_bytes: int | None = None,
              prefill_instances: int | None = None, decode_instances: int | None = None) -> dict[str, Any]:
    """What `simctl real` does: validate, serve in a child process with OMP_WAIT_POLICY=PASSIVE and the
    thread count set, write `out/{summary.json, requests.parquet, iterations.parquet, replicas.parquet}` (if
    `out`; a disaggregated run's child starts the prefill instance as its own child), and return the summary.
    InputError for bad options (also those only the child can check, e.g. cuda missing); RuntimeError, with
    the end of the child's stderr, if the child crashed."""
    from simctl.results.output import CLUSTER_RUN_FILES, check_out_dir

    config = RealConfig(policy=policy, workload=workload.resolved(DEFAULT_QPS, DEFAULT_NUM_REQUESTS),
                        model=model, device=device, dtype=dtype, threads=threads, options=dict(options or {}),
                        kv_capacity=kv_capacity, attention=attention,
                        eager=eager_on(device, eager, is_moe(model)), kv_budget_bytes=kv_budget_bytes,
                        prefill_instances=prefill_instances, decode_instances=decode_instances)
    config.validate()
    if config.threads is None:  # a disaggregated run's instances share the cores
        config = replace(config, threads=max(1, default_threads() // (2 if config.disaggregated else 1)))
    requests = config.workload.requests()
    check_memory(config, requests)
    out_path = None
    if out is not None:
        out_path = check_out_dir(Path(out), CLUSTER_RUN_FILES)
    return _run_worker(config, out_path)["summary"]
