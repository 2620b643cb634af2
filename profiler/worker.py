"""The profiling child process: `python -m profiler.worker --model M --device D --dtype T --threads N --grid G`.

`profiler.profile.profile` starts it with OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS set (OpenMP reads them
once, at start-up: setting them inside an already running process is too late). With the default (active)
policy, idle OpenMP threads spin, and on a shared machine the spinning threads of a process steal the cores
its own working threads need: timings were reported 20x slower under contention (simctl issue 3).

Protocol: one JSON object per line on the ORIGINAL stdout (everything else the process prints, at the Python
or the C level, is redirected to stderr):
  {"event": "start", "shapes": N, "total": steps, "skipped": [...]}     steps = N x sweeps of the grid
  {"event": "progress", "done": k, "total": steps, "label": "...", "time_s": median so far}   per step
  {"event": "row", "index": i, "label": "...", "row": {column: value}}   once per shape, in order, at the end
  {"event": "done", "meta": {...}}
  {"event": "error", "input": true|false, "message": "..."}           then exit 2 (input) or 1
"""

from __future__ import annotations

import argparse
import datetime as _dt
import gc
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from typing import Any, TextIO

import numpy as np

from simctl.errors import InputError

DEFAULT_CPU_KV_BYTES = 512 * 2 ** 20  # KV slab cap per shape on the CPU (a shared machine)
GPU_KV_SHARE = 0.5  # share of the free device memory (after the weights) a shape's KV slab may take
WARMUP_S = 1.0  # seconds of whole-model warm-up before the first shape (thread pools, allocator, caches)


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Worker:
    def __init__(self, model: str, device: str, dtype: str, threads: int, grid: str, seed: int,
                 out: TextIO) -> None:
        import torch

        from profiler.model import resolve_device, torch_dtype
        from sim.models import get_model

        self.out = out
        self.spec = get_model(model)
        self.dtype_name = dtype
        self.dtype = torch_dtype(dtype)
        self.device = resolve_device(device)
        self.threads = threads
        self.grid_name = grid
        self.seed = seed
        torch.set_num_threads(threads)
        self.gen = torch.Generator().manual_seed(seed)

    def emit(self, **msg: Any) -> None:
        self.out.write(json.dumps(msg, allow_nan=False) + "\n")
        self.out.flush()

    def _kv_budget_tokens(self, kv_bytes_per_token: int) -> int:
        import torch

        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * GPU_KV_SHARE) // kv_bytes_per_token
        return DEFAULT_CPU_KV_BYTES // kv_bytes_per_token

    def _segments(self, shape: Any) -> list[Any]:
        import torch

        from profiler.forward import Segment

        return [Segment(i, torch.randint(0, self.spec.vocab_size, (s.q,), generator=self.gen), s.c, s.sample)
                for i, s in enumerate(shape.segs)]

    @staticmethod
    def _call(executor: Any, shape: Any, segs: list[Any]) -> Any:
        """The timed call: one iteration of `shape` on `executor`."""
        if shape.padded:
            return lambda: executor.run_padded(segs, length=shape.length, kv_len=shape.kv_len)
        return lambda: executor.run(segs)

    def run(self) -> None:
        import torch
        import transformers

        from profiler.forward import ATTN_IMPLEMENTATION, RaggedExecutor
        from profiler.model import build_model
        from profiler.timing import adaptive_reps, summarize, time_fn
        from profiler.workloads import build_grid, prefill

        t_start = time.perf_counter()
        load_start = _load()
        model = build_model(self.spec, self.device, self.dtype, self.seed)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        probe = RaggedExecutor(model, 1, 1)
        kv_bpt = probe.kv_bytes_per_token
        del probe
        grid = build_grid(self.grid_name, self.spec.max_position, self._kv_budget_tokens(kv_bpt), self.seed)
        self.emit(event="start", shapes=len(grid.shapes), total=len(grid.shapes) * grid.passes,
                  skipped=grid.skipped)

        # Warm up the whole stack (thread pool start, allocator, first-call dispatch) before any shape.
        warm = min(128, self.spec.max_position)
        ex = RaggedExecutor(model, 1, warm)
        segs = self._segments(prefill(warm))
        t0 = time.perf_counter()
        while True:
            ex.run(segs)
            if time.perf_counter() - t0 > (WARMUP_S if grid.budget_s > 0 else 0.0):
                break
        del ex

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        # Sweep the grid `passes` times, in a fresh seeded order each time, splitting each shape's repetitions
        # between sweeps: a burst of load from other processes then lands on many shapes a little instead of
        # on a run of neighbouring shapes (on a shared machine, it showed as a whole region of the grid timed
        # 2-3x slow). The first sweep sizes each shape's repetitions from its first (warm-up) call.
        n = len(grid.shapes)
        times: list[list[float]] = [[] for _ in range(n)]
        segments = [self._segments(shape) for shape in grid.shapes]
        per_pass = [0] * n
        order_rng = np.random.default_rng(self.seed)
        done = 0
        gc_was_enabled = gc.isenabled()
        try:
            for sweep in range(grid.passes):
                order = list(range(n)) if sweep == 0 else order_rng.permutation(n).tolist()
                for i in order:
                    shape = grid.shapes[i]
                    executor = None  # frees the previous slab (by reference count) before allocating
                    executor = RaggedExecutor(model, shape.slots, shape.max_len)
                    gc.disable()  # no collector pauses inside timed calls (as timeit does)
                    fn = self._call(executor, shape, segments[i])
                    if sweep == 0:
                        est = time_fn(fn, max(grid.warmup - 1, 0), 1, self.device)
                        total = adaptive_reps(est[0], grid.budget_s, grid.min_reps, grid.max_reps)
                        per_pass[i] = max(1, -(-total // grid.passes))
                    elif grid.warmup:
                        time_fn(fn, grid.warmup - 1, 1, self.device)
                    times[i] += time_fn(fn, 0, per_pass[i], self.device)
                    gc.enable()
                    done += 1
                    self.emit(event="progress", done=done, total=n * grid.passes, label=shape.label(),
                              time_s=float(np.median(times[i])))
                executor = None
        finally:
            if gc_was_enabled:
                gc.enable()
        for i, shape in enumerate(grid.shapes):
            row = {**shape.features(), "reps": len(times[i]), **summarize(times[i])}
            self.emit(event="row", index=i, label=shape.label(), row=row)

        meta = {
            "model": self.spec.name,
            "model_shape": asdict(self.spec),
            "device": str(self.device),
            "device_name": (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                            else _cpu_name()),
            "dtype": self.dtype_name,
            "threads": torch.get_num_threads(),
            "torch_version": torch.__version__,
            "transformers_version": transformers.__version__,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY"),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "grid": self.grid_name,
            "seed": self.seed,
            "warmup": grid.warmup,
            "min_reps": grid.min_reps,
            "max_reps": grid.max_reps,
            "rep_budget_s": grid.budget_s,
            "passes": grid.passes,
            "attn_implementation": ATTN_IMPLEMENTATION,
            "executor": "ragged [1, T] forward over a per-layer KV slab, per-segment SDPA; padded kinds run a "
                        "real [B, L] batch; LM head on sampled rows only",
            "kv_bytes_per_token": kv_bpt,
            "kv_bytes_per_token_spec": self.spec.kv_bytes_per_token(self.dtype.itemsize),
            "weight_bytes": weight_bytes,
            "peak_memory_bytes": (torch.cuda.max_memory_allocated(self.device)
                                  if self.device.type == "cuda" else None),
            "prompt_sets": grid.prompt_sets,
            "skipped_shapes": grid.skipped,
            "num_shapes": len(grid.shapes),
            "load_avg_start": load_start,
            "load_avg_end": _load(),
            "wall_s": round(time.perf_counter() - t_start, 3),
        }
        self.emit(event="done", meta=meta)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m profiler.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--grid", default="full")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    # Keep the protocol stream clean: the original stdout is ours; anything else goes to stderr.
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def fail(e: BaseException, is_input: bool) -> int:
        out.write(json.dumps({"event": "error", "input": is_input, "message": str(e)}) + "\n")
        out.flush()
        return 2 if is_input else 1

    try:
        Worker(args.model, args.device, args.dtype, args.threads, args.grid, args.seed, out).run()
    except InputError as e:
        return fail(e, True)
    except Exception as e:  # noqa: BLE001 -- a bug or a device failure: report it, traceback on stderr
        import traceback

        traceback.print_exc()
        return fail(e if str(e) else RuntimeError(type(e).__name__), False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
