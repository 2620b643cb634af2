"""How a grid's shapes are timed (`profiler.worker`'s docstring says why): blocks of repetitions in seeded
sweeps, the share of the machine other processes used during each block (a block is quiet under
QUIET_SHARE), the shapes short of quiet blocks re-timed while time is left, and the estimate taken from the
quiet blocks."""

from __future__ import annotations

import gc
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from simctl.profiler.shapes import Shape
from simctl.profiler.timing import CpuMonitor, adaptive_reps, summarise_times, time_fn

if TYPE_CHECKING:
    import torch

    from simctl.profiler.vllm_grid import VLLMGrid
    from simctl.profiler.workloads import Grid

QUIET_SHARE = 0.05  # a block is quiet if other processes used at most this share of the machine's CPU
WARM_ALWAYS_S = 0.02  # a call shorter than this gets a warm-up call before every block, even when kept


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


def summarise_blocks(blocks: list[list[Block]], grid: Grid | VLLMGrid, monitor: CpuMonitor
                     ) -> tuple[list[dict[str, float]], dict[str, Any]]:
    """Per shape: reps, time_s, time_mean_s, time_p10_s, time_p90_s (median, mean and 10th/90th percentiles
    of the repetitions of `select_blocks`); and a summary of the timing for meta.json."""
    rows, no_quiet = [], []
    for i, bs in enumerate(blocks):
        if not any(b.quiet for b in bs):
            no_quiet.append(grid.shapes[i].label())
        times = [t for b in select_blocks(bs) for t in b.times]
        rows.append({"reps": len(times), **summarise_times(times)})
    every = [b for bs in blocks for b in bs]
    wall = np.array([sum(b.times) for b in every])
    spread = [r["time_p90_s"] / r["time_p10_s"] for r in rows]
    quiet_spread = []
    for bs in blocks:  # how far a shape's quiet blocks' medians stray from their median
        m = np.array([np.median(b.times) for b in bs if b.quiet])
        if len(m) >= 3:
            quiet_spread.append(float(np.median(np.abs(np.log(m / np.median(m))))))
    timing = {
        "estimator": "median (time_s; and mean, 10th/90th percentiles) of the repetitions of the blocks "
                     "timed while the rest of the machine was idle (quiet)",
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


class Sweeps:
    """Blocks of timed repetitions of every shape of `grid` for `worker` (`simctl.profiler.worker.Worker`: its
    tokens, segments, calls, seed, device and progress events): `grid.passes` sweeps in a fresh seeded order
    each, then re-timing of the shapes with fewer than `grid.quiet_blocks` quiet blocks, most needed first,
    until they have them or `deadline` (perf_counter seconds) passes."""

    def __init__(self, worker: Any, grid: Grid, model: torch.nn.Module, executor_cls: Any,
                 monitor: CpuMonitor, deadline: float) -> None:
        self.worker, self.grid, self.model, self.executor_cls = worker, grid, model, executor_cls
        self.monitor, self.deadline = monitor, deadline
        n = self.n = len(grid.shapes)
        self.blocks: list[list[Block]] = [[] for _ in range(n)]
        self.runs = grid.repetitions()
        self.tokens = [worker._tokens(shape) for shape in grid.shapes]
        self.calls = [0] * n  # calls of each shape so far, warm-ups included: the next is runs[i].call(...)
        self.per_block = [1] * n
        self.n_blocks = [grid.passes] * n  # blocks a shape gets: `passes`, fewer for few repetitions
        self.cost = [0.0] * n  # seconds a visit takes (warm-up + block), from the first visit
        self.rng = np.random.default_rng(worker.seed)
        self.total = n * grid.passes
        self.done = 0
        self.kept = self._kept(worker._keep_bytes())

    def _kept(self, allowance: int) -> dict[int, Any]:
        """Executors (KV slabs) kept between visits, smallest slabs first, within a memory allowance: a kept
        executor's next visit needs no warm-up when a call is long (its first call is then within ~1% of the
        next ones; a freshly allocated slab's first call is 3-4% slower)."""
        kept: dict[int, Any] = {}
        for i in sorted(range(self.n), key=lambda i: self.runs[i].kv_tokens):
            need = self.runs[i].kv_tokens * self.worker._kv_bpt
            if need > allowance:
                break
            kept[i] = None
            allowance -= need
        return kept

    def run(self) -> list[list[Block]]:
        for sweep in range(self.grid.passes):
            self._sweep(sweep)
        self._retime()
        self.kept.clear()
        return self.blocks

    def _visit(self, i: int, first: bool) -> None:
        grid, worker, monitor = self.grid, self.worker, self.monitor
        start = time.perf_counter()
        executor = self.kept.get(i)
        fresh = executor is None
        if fresh:
            worker.free_cached_memory()
            executor = self.executor_cls(self.model, *self.runs[i].slab)
            if i in self.kept:
                self.kept[i] = executor

        def next_call() -> tuple[Shape, list[Any]]:  # untimed: the shape and segments of the next call
            shape, base = self.runs[i].call(self.calls[i])
            self.calls[i] += 1
            return shape, worker._segments(shape, self.tokens[i], base)

        def fn(call: tuple[Shape, list[Any]]) -> Any:
            return worker._run(executor, *call)

        gc.disable()  # no collector pauses inside timed calls (as timeit does)
        try:
            if first:  # the warm-up call, timed, sizes the repetitions and the blocks
                est = time_fn(fn, max(grid.warmup - 1, 0), 1, worker.device, next_call)
                reps = adaptive_reps(est[0], grid.budget_s, grid.min_reps, grid.max_reps)
                self.n_blocks[i] = max(1, min(grid.passes, reps))
                self.per_block[i] = max(1, round(reps / self.n_blocks[i]))
            elif grid.warmup and (fresh or np.median(self.blocks[i][-1].times) < WARM_ALWAYS_S):
                time_fn(fn, grid.warmup - 1, 1, worker.device, next_call)
            r0, w0 = monitor.read(), time.perf_counter()
            times = time_fn(fn, 0, self.per_block[i], worker.device, next_call)
            wall = time.perf_counter() - w0
            r1 = monitor.read()
        finally:
            gc.enable()
        self.blocks[i].append(Block(times, monitor.foreign_share(r0, r1, wall),
                                    monitor.quiet(r0, r1, wall, QUIET_SHARE)))
        if first:
            self.cost[i] = time.perf_counter() - start

    def _visits(self, i: int, sweep: int) -> bool:
        """Whether shape i is timed in this sweep: every shape in the first; then its other blocks spread
        evenly over the remaining sweeps (a long shape has fewer, one repetition each)."""
        if sweep == 0:
            return True
        m, p = self.n_blocks[i] - 1, self.grid.passes - 1
        return (sweep * m) // p > ((sweep - 1) * m) // p

    def _median(self, i: int) -> float:
        return float(np.median([t for b in self.blocks[i] for t in b.times]))

    def _sweep(self, sweep: int) -> None:
        n, total = self.n, self.total
        order = list(range(n)) if sweep == 0 else self.rng.permutation(n).tolist()
        for i in order:
            if not self._visits(i, sweep):
                continue
            if sweep > 0 and time.perf_counter() + self.cost[i] > self.deadline:
                continue  # out of time: this shape keeps the blocks it has
            self._visit(i, sweep == 0)
            self.done += 1
            # progress in sweeps: the first sweep counts one step a shape, the others share the rest
            steps = self.done if sweep == 0 else n + round(
                (self.done - n) * (total - n) / max(sum(self.n_blocks) - n, 1))
            self.worker.emit(event="progress", done=min(steps, total), total=total,
                             label=self.grid.shapes[i].label(), time_s=self._median(i))

    def _quiet(self, i: int) -> int:
        return sum(b.quiet for b in self.blocks[i])

    def _retime(self) -> None:
        """Re-time the shapes still short of quiet blocks (the machine was busy when their turn came)."""
        grid = self.grid
        while grid.quiet_blocks > 0:
            short = [i for i in range(self.n) if self._quiet(i) < grid.quiet_blocks
                     and time.perf_counter() + self.cost[i] <= self.deadline]
            if not short:
                break
            fewest = min(self._quiet(i) for i in short)
            for i in self.rng.permutation([i for i in short if self._quiet(i) == fewest]).tolist():
                if time.perf_counter() + self.cost[i] > self.deadline:
                    continue
                self._visit(i, False)
                self.worker.emit(event="progress", done=min(self.done, self.total), total=self.total,
                                 label=f"re-timing {grid.shapes[i].label()}", time_s=self._median(i))
