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
- Quiet blocks. `profiler.timing.CpuMonitor` measures the CPU time every other process used during each
  block; a block is *quiet* when that is at most QUIET_SHARE (5%) of the machine's capacity. On the 2-core
  VM this was developed on, another process busy on one core moved a block by -40% (small shapes: the
  second OpenMP thread's vCPU is awake, so waking it is quick) to +70% (large ones), so contended blocks are
  not used at all. After the sweeps, shapes with fewer than `grid.quiet_blocks` quiet blocks are timed
  again, those with the fewest first, until they have them or the worker has run `grid.max_wall_s` (the
  full profile stays under 5 minutes, the quick one under 1, whatever the machine does).
- The estimate. time_s is the median of the repetitions of all of a shape's quiet blocks (time_p10_s /
  time_p90_s their percentiles; reps their count): the typical call, per-call jitter included (thread
  wake-ups: p90/p10 ~1.1 on that VM). Even with no other process running, about one block in ten was 10-25%
  slower (a 1-thread matmul timed alongside slowed down with it: interference from outside the VM, which no
  counter inside it shows). They stay in: a served workload meets those spells too, and an earlier
  estimator that kept only the faster half of the blocks made real runs 5-10% slower than their repriced
  iterations (simctl issue 4). A shape with no quiet block at all uses its least contended third of blocks
  and is listed in meta.json (`timing.shapes_without_quiet_block`): re-profile on a quieter machine.
- Served shapes (`profiler.shape_protocol`, `--protocol served`, the default). Serving never runs
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
import gc
import json
import math
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from functools import partial
from typing import Any, TextIO

import numpy as np

from common.errors import InputError
from executor.runtime import cpu_name
from profiler.shape_protocol import PROTOCOLS, ShapeProtocol
from profiler.shapes import Shape

QUIET_SHARE = 0.05  # a block is quiet if other processes used at most this share of the machine's CPU
DEFAULT_CPU_KV_BYTES = 512 * 2 ** 20  # KV slab cap per shape on the CPU (a shared machine)
KEEP_CPU_BYTES = 2 * 2 ** 30  # KV slabs kept allocated between visits of their shapes (CPU; see _measure)
WARM_ALWAYS_S = 0.02  # a call shorter than this gets a warm-up call before every block, even when kept
GPU_KV_SHARE = 0.5  # share of the free device memory (after the weights) a shape's KV slab may take
WARMUP_S = 1.0  # seconds of whole-model warm-up before the first shape (thread pools, allocator, caches)


@dataclass(slots=True)
class Block:
    """One visit's timed repetitions of a shape, and the rest of the machine's CPU use meanwhile."""

    times: list[float]
    foreign: float  # other processes' CPU time / the machine's capacity during the block
    quiet: bool  # foreign at most QUIET_SHARE (plus a tick)


def select_blocks(bs: list[Block]) -> list[Block]:
    """The blocks a shape's time is taken from: its quiet blocks, or, if it has none, its least contended
    third of blocks (at least one)."""
    return [b for b in bs if b.quiet] or sorted(bs, key=lambda b: b.foreign)[:max(1, len(bs) // 3)]


def summarize_blocks(blocks: list[list[Block]], grid: Any, monitor: Any
                     ) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """Per shape: reps, time_s, time_p10_s, time_p90_s (median and 10th/90th percentiles of the repetitions
    of `select_blocks`); and a summary of the timing for meta.json."""
    from profiler.timing import summarize

    rows, no_quiet = [], []
    for i, bs in enumerate(blocks):
        if not any(b.quiet for b in bs):
            no_quiet.append(grid.shapes[i].label())
        times = [t for b in select_blocks(bs) for t in b.times]
        rows.append({"reps": len(times), **summarize(times)})
    every = [b for bs in blocks for b in bs]
    wall = np.array([sum(b.times) for b in every])
    spread = [r["time_p90_s"] / r["time_p10_s"] for r in rows]
    quiet_spread = []
    for bs in blocks:  # how far a shape's quiet blocks' medians stray from their median
        m = np.array([np.median(b.times) for b in bs if b.quiet])
        if len(m) >= 3:
            quiet_spread.append(float(np.median(np.abs(np.log(m / np.median(m))))))
    timing = {
        "estimator": "median (and 10th/90th percentiles) of the repetitions of the blocks timed while the "
                     "rest of the machine was idle (quiet)",
        "quiet_share": QUIET_SHARE,
        "cpu_monitor": bool(monitor.available),
        "blocks": len(every),
        "quiet_blocks": sum(b.quiet for b in every),
        "quiet_blocks_wanted_per_shape": grid.quiet_blocks,
        "foreign_cpu_share": float(np.average([b.foreign for b in every], weights=wall)) if every else 0.0,
        "shapes_without_quiet_block": no_quiet,
        "median_p90_over_p10": float(np.median(spread)) if spread else None,
        "median_quiet_block_deviation": float(np.median(quiet_spread)) if quiet_spread else None,
    }
    return rows, timing


def _load() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


class Worker:
    def __init__(self, model: str, device: str, dtype: str, threads: int, grid: str, seed: int,
                 out: TextIO, protocol: str = "served", attention: str = "auto") -> None:
        import torch

        from catalogue.models import get_model
        from executor.config import ExecutorConfig
        from executor.model import resolve_device, torch_dtype

        self.out = out
        self.spec = get_model(model)
        self.dtype_name = dtype
        self.dtype = torch_dtype(dtype)
        self.device = resolve_device(device)
        self.threads = threads
        self.grid_name = grid
        self.seed = seed
        self.protocol = ShapeProtocol(protocol)
        self.executor_config = ExecutorConfig(attention)
        self.executor_config.validate(str(self.device))
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

    def _tokens(self, shape: Shape) -> list[Any]:
        """Random token ids for each segment of `shape` (drawn once per shape; every call reuses them)."""
        import torch

        return [torch.randint(0, self.spec.vocab_size, (s.q,), generator=self.gen) for s in shape.segs]

    @staticmethod
    def _segments(shape: Shape, tokens: list[Any], base: int = 0) -> list[Any]:
        """The executor's segments for one call of `shape`, in slab rows base, base + 1, ..."""
        from executor.ragged import Segment

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

    def _measure(self, grid: Any, model: Any, executor_cls: Any, monitor: Any, deadline: float
                 ) -> list[list[Block]]:
        """Blocks of timed repetitions of every shape of `grid` (see the module docstring): `grid.passes`
        sweeps in a fresh seeded order each, then re-timing of the shapes with fewer than `grid.quiet_blocks`
        quiet blocks, most needed first, until they have them or `deadline` (perf_counter seconds) passes."""
        from profiler.timing import adaptive_reps, time_fn

        n = len(grid.shapes)
        blocks: list[list[Block]] = [[] for _ in range(n)]
        runs = grid.repetitions()
        tokens = [self._tokens(shape) for shape in grid.shapes]
        calls = [0] * n  # calls of each shape so far, warm-ups included: the next is runs[i].call(calls[i])
        per_block = [1] * n
        n_blocks = [grid.passes] * n  # blocks a shape gets: `passes`, fewer for shapes of fewer repetitions
        cost = [0.0] * n  # seconds a visit takes (warm-up + block), from the first visit
        rng = np.random.default_rng(self.seed)
        total = n * grid.passes
        done = 0
        # Executors (KV slabs) kept between visits, smallest slabs first, within a memory allowance: a kept
        # executor's next visit needs no warm-up when a call is long (its first call is then within ~1% of
        # the next ones; a freshly allocated slab's first call is 3-4% slower).
        kept: dict[int, Any] = {}
        allowance = self._keep_bytes()
        for i in sorted(range(n), key=lambda i: runs[i].kv_tokens):
            need = runs[i].kv_tokens * self._kv_bpt
            if need > allowance:
                break
            kept[i] = None
            allowance -= need

        def visit(i: int, first: bool) -> None:
            start = time.perf_counter()
            executor = kept.get(i)
            fresh = executor is None
            if fresh:
                executor = executor_cls(model, *runs[i].slab)
                if i in kept:
                    kept[i] = executor

            def next_call() -> tuple[Shape, list[Any]]:  # untimed: the shape and segments of the next call
                shape, base = runs[i].call(calls[i])
                calls[i] += 1
                return shape, self._segments(shape, tokens[i], base)

            def fn(call: tuple[Shape, list[Any]]) -> Any:
                return self._run(executor, *call)

            gc.disable()  # no collector pauses inside timed calls (as timeit does)
            try:
                if first:  # the warm-up call, timed, sizes the repetitions and the blocks
                    est = time_fn(fn, max(grid.warmup - 1, 0), 1, self.device, next_call)
                    reps = adaptive_reps(est[0], grid.budget_s, grid.min_reps, grid.max_reps)
                    n_blocks[i] = max(1, min(grid.passes, reps))
                    per_block[i] = max(1, round(reps / n_blocks[i]))
                elif grid.warmup and (fresh or np.median(blocks[i][-1].times) < WARM_ALWAYS_S):
                    time_fn(fn, grid.warmup - 1, 1, self.device, next_call)
                r0, w0 = monitor.read(), time.perf_counter()
                times = time_fn(fn, 0, per_block[i], self.device, next_call)
                wall = time.perf_counter() - w0
                r1 = monitor.read()
            finally:
                gc.enable()
            blocks[i].append(Block(times, monitor.foreign_share(r0, r1, wall),
                                   monitor.quiet(r0, r1, wall, QUIET_SHARE)))
            if first:
                cost[i] = time.perf_counter() - start

        def visits(i: int, sweep: int) -> bool:
            """Whether shape i is timed in this sweep: every shape in the first; then its other blocks spread
            evenly over the remaining sweeps (a long shape has fewer, one repetition each)."""
            if sweep == 0:
                return True
            m, p = n_blocks[i] - 1, grid.passes - 1
            return (sweep * m) // p > ((sweep - 1) * m) // p

        for sweep in range(grid.passes):
            order = list(range(n)) if sweep == 0 else rng.permutation(n).tolist()
            for i in order:
                if not visits(i, sweep):
                    continue
                if sweep > 0 and time.perf_counter() + cost[i] > deadline:
                    continue  # out of time: this shape keeps the blocks it has
                visit(i, sweep == 0)
                done += 1
                # progress in sweeps: the first sweep counts one step a shape, the others share the rest
                steps = done if sweep == 0 else n + round(
                    (done - n) * (total - n) / max(sum(n_blocks) - n, 1))
                self.emit(event="progress", done=min(steps, total), total=total, label=grid.shapes[i].label(),
                          time_s=float(np.median([t for b in blocks[i] for t in b.times])))
        # Re-time the shapes still short of quiet blocks (the machine was busy when their turn came).
        while grid.quiet_blocks > 0:
            short = [i for i in range(n) if sum(b.quiet for b in blocks[i]) < grid.quiet_blocks
                     and time.perf_counter() + cost[i] <= deadline]
            if not short:
                break
            fewest = min(sum(b.quiet for b in blocks[i]) for i in short)
            for i in rng.permutation([i for i in short
                                      if sum(b.quiet for b in blocks[i]) == fewest]).tolist():
                if time.perf_counter() + cost[i] > deadline:
                    continue
                visit(i, False)
                self.emit(event="progress", done=min(done, total), total=total,
                          label=f"re-timing {grid.shapes[i].label()}",
                          time_s=float(np.median([t for b in blocks[i] for t in b.times])))
        kept.clear()
        return blocks

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
        import transformers

        from executor.model import build_model
        from executor.ragged import RaggedExecutor, attention_kernels
        from executor.ragged_attention import ATTN_IMPLEMENTATION
        from profiler.shapes import prefill
        from profiler.timing import CpuMonitor
        from profiler.workloads import build_grid

        t_start = time.perf_counter()
        load_start = _load()
        model = build_model(self.spec, self.device, self.dtype, self.seed)
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        kernels = attention_kernels(model, self.executor_config)  # InputError if a kind has no kernel
        executor_cls = partial(RaggedExecutor, config=self.executor_config)
        probe = executor_cls(model, 1, 1)
        kv_bpt = self._kv_bpt = probe.kv_bytes_per_token
        del probe
        grid = build_grid(self.grid_name, self.spec.max_position, self._kv_budget_tokens(kv_bpt), self.seed,
                          self.protocol, self.spec.moe)
        self.emit(event="start", shapes=len(grid.shapes), total=len(grid.shapes) * grid.passes,
                  skipped=grid.skipped)

        # Warm up the whole stack (thread pool start, allocator, first-call dispatch) before any shape.
        warm = prefill(min(128, self.spec.max_position))
        ex = executor_cls(model, 1, warm.max_len)
        segs = self._segments(warm, self._tokens(warm))
        t0 = time.perf_counter()
        while True:
            ex.run(segs)
            if time.perf_counter() - t0 > (WARMUP_S if grid.budget_s > 0 else 0.0):
                break
        del ex

        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        monitor = CpuMonitor()
        blocks = self._measure(grid, model, executor_cls, monitor, deadline=t_start + grid.max_wall_s)
        rows, timing = summarize_blocks(blocks, grid, monitor)
        for i, shape in enumerate(grid.shapes):
            self.emit(event="row", index=i, label=shape.label(), row={**shape.features(), **rows[i]})

        meta = {
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
            "timing": timing,
            "attn_implementation": ATTN_IMPLEMENTATION,
            "executor_config": self.executor_config.record(str(self.device)),
            "attention_kernels": kernels,
            "executor": "ragged [1, T] forward over a per-layer KV slab, per-segment SDPA; padded kinds run "
                        "a real [B, L] batch; LM head on sampled rows only",
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
    p.add_argument("--protocol", default="served", choices=PROTOCOLS)
    p.add_argument("--attention", default="auto")
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
        Worker(args.model, args.device, args.dtype, args.threads, args.grid, args.seed, out, args.protocol,
               args.attention).run()
    except InputError as e:
        return fail(e, True)
    except Exception as e:  # noqa: BLE001 -- a bug or a device failure: report it, traceback on stderr
        import traceback

        traceback.print_exc()
        return fail(e if str(e) else RuntimeError(type(e).__name__), False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
