"""`profile()`: time a model's iterations on a device and write `profile.csv` + `meta.json`.

The timing runs in a child process (`python -m profiler.worker`) started with OMP_WAIT_POLICY=PASSIVE and
OMP_NUM_THREADS / MKL_NUM_THREADS = threads: OpenMP reads these once at start-up, and without the passive
policy idle OpenMP threads spin and, on a shared machine, timings fall apart (reported 20x slower under
contention). The child streams one JSON line per shape; this process shows a rich progress bar and writes
both files only at the end, each to a temporary name in the output folder first, then renamed (profile.csv,
then meta.json): a failed or interrupted profile leaves the folder as it was.

profile.csv: one row per shape, the columns of `simctl.profiler.shapes.COLUMNS` (see that module's table).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simctl.common.children import failure_line, stop
from simctl.common.errors import InputError
from simctl.executor.config import ExecutorConfig, eager_on
from simctl.executor.model import DTYPES
from simctl.executor.runtime import default_threads, worker_env
from simctl.profiler.shape_protocol import PROTOCOLS
from simctl.profiler.shapes import COLUMNS
from simctl.profiler.workloads import GRID_NAMES

if TYPE_CHECKING:
    from simctl.catalogue.models import ModelSpec

PROFILE_FILES = ("profile.csv", "meta.json")


def _check_inputs(model_name: str, device: str, dtype: str, threads: int | None, grid: str,
                  protocol: str) -> tuple[Any, str, int]:
    from simctl.catalogue.models import get_model

    spec = get_model(model_name)  # InputError for an unknown model
    if spec.mlp != "gated":
        raise InputError(f"model {spec.name!r}: only gated (SwiGLU, Llama-style) shapes can be built for "
                         f"profiling")
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} not supported; choose one of {', '.join(DTYPES)}")
    dev = str(device).lower()
    if dev not in ("cpu", "cuda") and not dev.startswith("cuda:"):
        raise InputError(f"device {device!r} not supported; choose cpu or cuda")
    if dev.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            raise InputError("cuda requested but not available")
    if threads is None:
        threads = default_threads()
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise InputError(f"threads must be a positive integer, got {threads!r}")
    if grid not in GRID_NAMES:
        raise InputError(f"grid {grid!r} unknown; choose one of {', '.join(GRID_NAMES)}")
    if protocol not in PROTOCOLS:
        raise InputError(f"shape protocol {protocol!r} unknown; choose one of {', '.join(PROTOCOLS)}")
    _check_memory(spec, dev, dtype, grid)
    return spec, dev, threads


def _check_memory(spec: ModelSpec, device: str, dtype: str, grid: str) -> None:
    """The model, a shape's KV slab (on the CPU its cap; on cuda the slab takes a share of what the weights
    leave) and a prefill of the longest profiled shape against the device's memory, before the child
    builds anything (InputError)."""
    from simctl.executor.memory import DTYPE_BYTES, check_fits
    from simctl.profiler.worker import DEFAULT_CPU_KV_BYTES
    from simctl.profiler.workloads import build_grid

    shapes = build_grid(grid, spec.max_position).shapes
    cap = DEFAULT_CPU_KV_BYTES // spec.kv_bytes_per_token(DTYPE_BYTES[dtype]) if device == "cpu" else 0
    kv_tokens = min(cap, max(s.kv_tokens for s in shapes))
    check_fits(spec, dtype, kv_tokens, max(s.max_len for s in shapes), device)


def write_profile(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    """profile.csv then meta.json, all or none."""
    import pandas as pd

    from simctl.results.output import json_text, write_files

    frame = pd.DataFrame(rows, columns=list(COLUMNS))
    meta_text = json_text(meta)
    write_files(out, {"profile.csv": lambda p: frame.to_csv(p, index=False),
                      "meta.json": lambda p: p.write_text(meta_text, encoding="utf-8")}, "the profile")


def worker_command(model_name: str, device: str, dtype: str, threads: int, grid: str, seed: int,
                   protocol: str, config: ExecutorConfig) -> list[str]:
    return [sys.executable, "-m", "simctl.profiler.worker", "--model", model_name, "--device", device,
            "--dtype", dtype, "--threads", str(threads), "--grid", grid, "--seed", str(seed), "--protocol",
            protocol, "--attention", config.attention, *([] if config.eager else ["--cuda-graphs"])]


def run_worker(model_name: str, device: str, dtype: str, threads: int, grid: str, seed: int, protocol: str,
               config: ExecutorConfig, on_event: Callable[[dict[str, Any]], None]
               ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the worker to completion; returns (rows, meta). `on_event` sees every protocol message."""
    return run_child(worker_command(model_name, device, dtype, threads, grid, seed, protocol, config),
                     worker_env(threads), on_event)


def run_child(command: list[str], env: dict[str, str], on_event: Callable[[dict[str, Any]], None]
              ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run a timing child speaking the worker's protocol (`profiler/worker.py`) to completion; returns (rows,
    meta). `on_event` sees every protocol message."""
    rows: list[dict[str, Any]] = []
    meta: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    with tempfile.TemporaryFile(mode="w+", encoding="utf-8", errors="replace") as err:
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=err,
                                stdin=subprocess.DEVNULL, text=True, encoding="utf-8")
        try:
            assert proc.stdout is not None
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if not isinstance(msg, dict):
                    continue
                event = msg.get("event")
                if event == "row":
                    rows.append(msg["row"])
                elif event == "done":
                    meta = msg["meta"]
                elif event == "error":
                    error = msg
                on_event(msg)
            rc = proc.wait()
        finally:
            stop(proc)  # bounded, when interrupted: a child holding a model may take minutes to exit
        if error is not None and error.get("input"):
            raise InputError(error["message"])
        if rc != 0 or meta is None:
            err.seek(0)
            raise RuntimeError(failure_line("profiler worker", rc, error.get("message") if error else None,
                                            err.read()))
    return rows, meta


def profile(model_name: str, device: str, dtype: str, threads: int | None, quick: bool, out_dir: str | Path,
            progress: bool = True, *, grid: str | None = None, seed: int = 0, protocol: str = "served",
            attention: str = "auto", eager: bool | None = None) -> Path:
    """Profile `model_name` (a catalogue shape built with random weights) on `device` and write
    `out_dir/profile.csv` and `out_dir/meta.json`; returns `out_dir`.

    threads: CPU threads of the timing process (default: `default_threads()`).
    quick: the `quick` grid (under a minute for `tiny` on a CPU) instead of `full`.
    grid: overrides `quick`: "full", "quick" or "test" (a few shapes, for tests).
    protocol: how a shape's repetitions run (`simctl.profiler.shape_protocol`): "served" (contexts and slab
    rows vary from call to call, as in serving) or "fixed" (the same shape every call).
    attention: the SDPA kernels (`executor.config.ATTENTION`), recorded in meta.json with those each kind of
    call ran. eager: False replays decode steps from CUDA graphs (`executor.cuda_graphs`) [default: on a GPU
    but for a mixture of experts, `simctl.executor.config.eager_on`].
    Raises InputError for an unknown model, dtype or device, cuda requested but missing, or a bad out_dir.
    """
    from simctl.catalogue.models import model_in_working_folder
    from simctl.results.output import check_out_dir

    grid = grid if grid is not None else ("quick" if quick else "full")
    model_name = model_in_working_folder(model_name)  # the timing child finds the same config.json
    spec, dev, threads = _check_inputs(model_name, device, dtype, threads, grid, protocol)
    config = ExecutorConfig(attention, eager_on(dev, eager, spec.moe is not None))
    config.validate(dev)
    out = check_out_dir(Path(out_dir))

    with progress_events(f"{spec.name} on {dev}", progress) as on_event:
        rows, meta = run_worker(spec.name, dev, dtype, threads, grid, seed, protocol, config, on_event)
    write_profile(out, rows, meta)
    return out


@contextmanager
def progress_events(what: str, progress: bool) -> Iterator[Callable[[dict[str, Any]], None]]:
    """An `on_event` for `run_child` that shows a rich progress bar on stderr (or nothing)."""
    if not progress:
        yield lambda msg: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]profile[/] {task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn(), console=Console(stderr=True), transient=False)
    task = bar.add_task(f"{what}: starting", total=None)

    def on_event(msg: dict[str, Any]) -> None:
        if msg.get("event") == "start":
            bar.update(task, total=msg["total"], description=what)
        elif msg.get("event") == "progress":
            bar.update(task, completed=msg["done"],
                       description=f"{msg['label']}: {msg['time_s'] * 1e3:.2f} ms")
        elif msg.get("event") == "done":
            bar.update(task, description=f"{what}: done in {msg['meta']['wall_s']:.0f} s")

    with bar:
        yield on_event
