"""The profiling child process: `python -m profiler.worker --model M --device D --dtype T --threads N --grid
G`.

`profiler.profile.profile` starts it with OMP_WAIT_POLICY=PASSIVE and OMP_NUM_THREADS set (OpenMP reads them
once, at start-up: setting them inside an already running process is too late). With the default (active)
policy, idle OpenMP threads spin, and on a shared machine the spinning threads of a process steal the cores
its own working threads need: timings were reported 20x slower under contention (simctl issue 3).

How a shape is timed (the measurement is the limit of the fit, so it is built for a small shared machine):

- Blocks and sweeps. The grid is swept `grid.passes` times (16 for `full`), in a fresh seeded order each
  time; each visit of a shape times one block of repetitions. A shape's repetitions (`budget_s` over the
  time of its first call, within [min_reps, max_reps]) are split into min(passes, repetitions) blocks, the
  blocks of a long shape (one repetition each) spread evenly over the sweeps. A burst of load then lands on
  a few blocks of many shapes instead of on every repetition of a run of neighbouring shapes, and the
  shape's estimate rests on many separate moments: between blocks lies most of the variance (a block's
  median moved by ~3-4% from block to block, the calls within a block by p90/p10 ~1.1), so more, shorter
  blocks beat fewer, longer ones (held-out error of the fit when subsampling a 10-block profile: 3 blocks
  3.2%, 7 blocks 2.7%, 10 blocks 2.6%; profiles with 16 blocks fitted at 2.3%).
- Quiet blocks. `simctl.profiler.timing.CpuMonitor` measures the CPU time every other process used during each
  block; a block is *quiet* when that is at most QUIET_SHARE (5%) of the machine's capacity. On the 2-core
  VM this was developed on, another process busy on one core moved a block by -40% (small shapes: the
  second OpenMP thread's vCPU is awake, so waking it is quick) to +70% (large ones), so contended blocks are
  not used at all. After the sweeps, shapes with fewer than `grid.quiet_blocks` quiet blocks are timed
  again, those with the fewest first, until they have them or the worker has run `grid.max_wall_s` (the
  full profile stays under 5 minutes, the quick one under 1, whatever the machine does).
- The estimate. time_s is the median of the repetitions of all of a shape's quiet blocks (time_mean_s their
  mean, time_p10_s / time_p90_s their percentiles; reps their count): the typical call, per-call jitter
  included (thread wake-ups: p90/p10 1.1-1.4 on that VM). The mean is 1.6-1.9% above the median at the median
  shape (jitter is skewed to the slow side), and a served run's busy time is a sum of calls; but repricing 12
  validation runs (tiny and tiny-moe, 2026-11-25) with fits of the same profiles' means and medians put real /
  priced at 0.925-1.039 with the means and 0.951-1.063 with the medians, so the median stays
  (`bench/results/validate_moe.md`). Even with no other process running, about one block in ten was 10-25%
  slower (a 1-thread matmul timed alongside slowed down with it: interference from outside the VM, which no
  counter inside it shows). They stay in: a served workload meets those spells too, and an earlier estimator
  that kept only the faster half of the blocks made real runs 5-10% slower than their repriced iterations
  (simctl issue 4). A shape with no quiet block at all uses its least contended third of blocks and is listed
  in meta.json (`timing.shapes_without_quiet_block`): re-profile on a quieter machine.
- Served shapes (`simctl.profiler.shape_protocol`, `--protocol served`, the default). Serving never runs
  the same iteration twice: contexts grow by a token a step and requests sit in whichever slab rows they hold.
  A profile that repeats one shape in the same rows lets every cache keyed on it stay warm (on an H100,
  SDPA's cuDNN backend built a new plan per KV length: 124-127 ms a decode step in serving vs 31-42 ms
  with the context fixed, simctl issue 11). So each call of a shape, warm-ups included, moves every cached
  context by a different few tokens (0, +1, -1, +2, -2, ...: symmetric around the shape, whose features
  the row keeps) and its segments one slab row further, on a slab longer and wider than the shape. The
  executor sees each call's segments only when it runs them (`time_fn`'s untimed `setup`). `--protocol
  fixed` times the same shape every call, to see what the caches give.
- Warm-up and slabs. The first call of a shape after others ran is 3-5% slower (caches, a fresh KV slab's
  first touch), so each visit starts with an untimed call -- except visits of long shapes (>= 20 ms) whose
  executor was kept from the previous visit (executors are kept, smallest KV slabs first, within 2 GiB on
  the CPU), where that first call is within ~1% and the saved time buys more blocks.

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
import json
import math
import os
import platform
import sys
import time
from collections.abc import Callable
from dataclasses import asdict
from functools import partial
from typing import TYPE_CHECKING, Any, TextIO

from simctl.common.errors import InputError
from simctl.costs.graph_buckets import GraphShapes
from simctl.executor.runtime import cpu_name
from simctl.profiler.shape_protocol import PROTOCOLS, ShapeProtocol
from simctl.profiler.shapes import Shape
from simctl.profiler.sweeps import Block, Sweeps, summarise_blocks

if TYPE_CHECKING:
    import torch

    from simctl.profiler.timing import CpuMonitor
    from simctl.profiler.workloads import Grid

DEFAULT_CPU_KV_BYTES = 512 * 2 ** 20  # KV slab cap per shape on the CPU (a shared machine)
KEEP_CPU_BYTES = 2 * 2 ** 30  # KV slabs kept allocated between visits of their shapes (CPU; see measure)
GPU_KV_SHARE = 0.5  # share of the free device memory (after the weights) a shape's KV slab may take
WARMUP_S = 1.0  # seconds of whole-model warm-up before the first shape (thread pools, allocator, caches)


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Worker:
    def __init__(self, model: str, device: str, dtype: str, threads: int, grid: str, seed: int,
                 out: TextIO, protocol: str = "served", attention: str = "auto", eager: bool = True) -> None:
        import torch

        from simctl.catalogue.models import get_model
        from simctl.executor.config import ExecutorConfig
        from simctl.executor.model import resolve_device, torch_dtype

        self.out = out
        self.spec = get_model(model)
        self.dtype_name = dtype
        self.dtype = torch_dtype(dtype)
        self.device = resolve_device(device)
        self.threads = threads
        self.grid_name = grid
        self.seed = seed
        self.protocol = ShapeProtocol(protocol)
        self.executor_config = ExecutorConfig(attention, eager)
        self.executor_config.validate(str(self.device))
        torch.set_num_threads(threads)
        self.gen = torch.Generator().manual_seed(seed)

    def emit(self, **msg: Any) -> None:
        self.out.write(json.dumps(msg, allow_nan=False) + "\n")
        self.out.flush()

    def kv_budget_tokens(self, kv_bytes_per_token: int) -> int:
        """The KV tokens the grid's slabs may hold on this device: a share of a GPU's free memory, or a fixed
        budget on the CPU."""
        import torch

        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            return int(free * GPU_KV_SHARE) // kv_bytes_per_token
        return DEFAULT_CPU_KV_BYTES // kv_bytes_per_token

    def free_cached_memory(self) -> None:
        """Hand a GPU's cached blocks back before a new KV slab: the grid's largest slabs are sized to the
        free memory, and blocks the caching allocator kept from smaller dropped slabs left a 48 GiB slab of
        llama-2-7b without room on an 80 GB H100 (issue 41). Untimed: between a shape's blocks."""
        if self.device.type == "cuda":
            import torch

            torch.cuda.empty_cache()

    def _tokens(self, shape: Shape) -> list[Any]:
        """Random token ids for each segment of `shape` (drawn once per shape; every call reuses them)."""
        import torch

        return [torch.randint(0, self.spec.vocab_size, (s.q,), generator=self.gen) for s in shape.segs]

    @staticmethod
    def _segments(shape: Shape, tokens: list[Any], base: int = 0) -> list[Any]:
        """The executor's segments for one call of `shape`, in slab rows base, base + 1, ..."""
        from simctl.executor.ragged import Segment

        return [Segment(base + i, t, s.c, s.sample) for i, (s, t) in enumerate(zip(shape.segs, tokens))]

    @staticmethod
    def _run(executor: Any, shape: Shape, segs: list[Any]) -> Any:
        """The timed call: one iteration of `shape` on `executor`."""
        if shape.bins:
            return executor.run_binpacked([[segs[i] for i in row] for row in shape.bins], shape.length)
        if shape.padded:
            dense = shape.dense or shape.kind == "padded_insertion"
            return executor.run_padded(segs, length=shape.length, kv_len=shape.kv_len, dense=dense)
        return executor.run(segs)

    def measure(self, grid: Grid, model: torch.nn.Module, executor_cls: Any, monitor: CpuMonitor,
                deadline: float, kv_bytes_per_token: int) -> list[list[Block]]:
        """Blocks of timed repetitions of every shape of `grid` (`profiler.sweeps.Sweeps`), each shape's KV
        slab sized at `kv_bytes_per_token`: the profile's own timing loop, which bench/profile_protocols.py
        also runs to compare the shape protocols."""
        self._kv_bpt = kv_bytes_per_token
        return Sweeps(self, grid, model, executor_cls, monitor, deadline).run()

    def _keep_bytes(self) -> int:
        """Memory the kept executors' KV slabs may take: on the CPU a share of the machine's memory (at most
        KEEP_CPU_BYTES); on a GPU none (its memory is the profile's limit already)."""
        if self.device.type != "cpu":
            return 0
        try:
            mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_AVPHYS_PAGES")
        except (ValueError, OSError, AttributeError):
            return 0
        return int(min(KEEP_CPU_BYTES, mem // 8))

    def run(self) -> None:
        import torch

        from simctl.executor.model import build_model
        from simctl.executor.ragged import RaggedExecutor, attention_kernels
        from simctl.profiler.timing import CpuMonitor
        from simctl.profiler.workloads import build_grid

        t_start = time.perf_counter()
        load_start = _load()
        model = build_model(self.spec, self.device, self.dtype, self.seed)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        kernels = attention_kernels(model, self.executor_config)  # InputError if a kind has no kernel
        executor_cls = partial(RaggedExecutor, config=self.executor_config)
        probe = executor_cls(model, 1, 1)
        kv_bpt = probe.kv_bytes_per_token
        del probe
        graphs = None if self.executor_config.eager else GraphShapes()
        grid = build_grid(self.grid_name, self.spec.max_position, self.kv_budget_tokens(kv_bpt), self.seed,
                          self.protocol, self.spec.moe, graphs)
        self.emit(event="start", shapes=len(grid.shapes), total=len(grid.shapes) * grid.passes,
                  skipped=grid.skipped)

        self._warm_up(model, executor_cls, WARMUP_S if grid.budget_s > 0 else 0.0)
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        monitor = CpuMonitor()
        blocks = self.measure(grid, model, executor_cls, monitor, t_start + grid.max_wall_s, kv_bpt)
        rows, timing = summarise_blocks(blocks, grid, monitor)
        for i, shape in enumerate(grid.shapes):
            self.emit(event="row", index=i, label=shape.label(), row={**shape.features(graphs), **rows[i]})

        meta = {**self._setting_meta(grid), "timing": timing, "attention_kernels": kernels,
                "kv_bytes_per_token": kv_bpt, "weight_bytes": weight_bytes,
                "peak_memory_bytes": (torch.cuda.max_memory_allocated(self.device)
                                      if self.device.type == "cuda" else None),
                "load_avg_start": load_start, "load_avg_end": _load(),
                "wall_s": round(time.perf_counter() - t_start, 3)}
        self.emit(event="done", meta=meta)

    def _warm_up(self, model: torch.nn.Module, executor_cls: Any, seconds: float) -> None:
        """Warm up the whole stack (thread pool start, allocator, first-call dispatch) before any shape."""
        from simctl.profiler.shapes import prefill

        warm = prefill(min(128, self.spec.max_position))
        ex = executor_cls(model, 1, warm.max_len)
        segs = self._segments(warm, self._tokens(warm))
        t0 = time.perf_counter()
        while True:
            ex.run(segs)
            if time.perf_counter() - t0 > seconds:
                break

    def _setting_meta(self, grid: Grid) -> dict[str, Any]:
        """What meta.json records of the profile's settings, software and machine."""
        import torch
        import transformers

        from simctl.executor.ragged_attention import ATTN_IMPLEMENTATION

        return {
            "model": self.spec.name,
            "model_shape": asdict(self.spec),
            "device": str(self.device),
            "device_name": (torch.cuda.get_device_name(self.device) if self.device.type == "cuda"
                            else cpu_name()),
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
            "shape_protocol": grid.protocol_meta(),
            "max_wall_s": grid.max_wall_s if math.isfinite(grid.max_wall_s) else None,
            "attn_implementation": ATTN_IMPLEMENTATION,
            "executor_config": self.executor_config.record(str(self.device)),
            "executor": "ragged [1, T] forward over a per-layer KV slab, per-segment SDPA; padded kinds run "
                        "a real [B, L] batch; LM head on sampled rows only",
            "kv_bytes_per_token_spec": self.spec.kv_bytes_per_token(self.dtype.itemsize),
            "prompt_sets": grid.prompt_sets,
            "skipped_shapes": grid.skipped,
            "num_shapes": len(grid.shapes),
        }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simctl.profiler.worker")
    p.add_argument("--model", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, required=True)
    p.add_argument("--grid", default="full")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--protocol", default="served", choices=PROTOCOLS)
    p.add_argument("--attention", default="auto")
    p.add_argument("--cuda-graphs", action="store_true", help="decode steps replay CUDA graphs")
    args = p.parse_args(argv)

    return child_protocol(lambda out: Worker(args.model, args.device, args.dtype, args.threads, args.grid,
                                        args.seed, out, args.protocol, args.attention,
                                        not args.cuda_graphs).run())


def child_protocol(body: Callable[[TextIO], None]) -> int:
    """A profiling child's protocol around `body(out)`: the original stdout becomes `out`, the event stream,
    and anything else printed goes to stderr; an error ends the stream as an `error` event (`input`: the
    user's mistake, exit 2; else a bug or a device failure, its traceback on stderr, exit 1)."""
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def fail(e: BaseException, is_input: bool) -> int:
        out.write(json.dumps({"event": "error", "input": is_input, "message": str(e)}) + "\n")
        out.flush()
        return 2 if is_input else 1

    try:
        body(out)
    except InputError as e:
        return fail(e, True)
    except Exception as e:  # noqa: BLE001 -- a bug or a device failure: report it, traceback on stderr
        import traceback

        traceback.print_exc()
        return fail(e if str(e) else RuntimeError(type(e).__name__), False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
