"""The vLLM profiling child: `python -m simctl.profiler.vllm_worker --model M --dtype T --grid G --seed S`.

It times the installed vLLM's own engine steps at controlled shapes (`profiler/vllm_grid.py`), host overhead
included: scheduling, input preparation, the forward pass, sampling, output processing. vLLM's engine core
runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set before vLLM is imported) and `LLMEngine.step()`
is called one step at a time, each timed by the wall clock (every step returns its sampled tokens to the
host, so nothing is left running when it returns). Prefix caching is off: a hit would change the shape.
The model worker runs as served vLLM runs it (`AsyncLLM`, `simctl real --engine vllm`): vLLM's multiprocess
executor (`distributed_executor_backend="mp"`, which serving always uses on a CPU), a process of its own
whose OpenMP threads vLLM binds to the cores left after one reserved for the engine core and the front end.
The in-process executor vLLM would otherwise pick binds nothing: on a 2-core VM its model ran on both cores,
and decode steps of 16-64 requests came 1.6-1.7x and prefills 1.8-2x faster than served vLLM's (measured).
What served steps pay beyond these (the front end beside the engine core) is `simctl.profiler.vllm_served`'s,
timed by another child (`--stage served`) after this one ended.

Shapes are made by what is submitted and by the scheduler's token budget, set step by step
(`Scheduler.max_num_scheduled_tokens`, read by every `schedule()`; lowered only, so the model runner's
buffers, sized for the engine's max_num_batched_tokens, hold): vLLM schedules running requests first, decodes
then chunks in arrival order, so a budget of B + q gives a running batch of B decodes and a chunk of q of the
newest prompt. Every step's actual shape is read from the scheduler's output (`schedule()` is wrapped:
`num_scheduled_tokens` and each request's `num_computed_tokens` before the step) and turned into the plan the
simulator would build (`policies.plan.packed`); a timed step whose shape is not the probe's is an error. The
row's features are `simctl.costs.features.plan_features` of the middle timed step of the first visit (contexts
move by a token a step around it, so the median step is that one).

Timing reuses the profiler's machinery: each visit of a probe is a `profiler.sweeps.Block` (its timed steps
and the CPU the rest of the machine used meanwhile, `profiler.timing.CpuMonitor`), visits are spread over
sweeps in seeded random orders, and a row's time is the median of the steps of its quiet blocks
(`simctl.profiler.sweeps.summarise_blocks`). Protocol on the original stdout: as `profiler/worker.py`'s.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import sys
import time
from dataclasses import asdict
from typing import TYPE_CHECKING, Any, TextIO

import numpy as np

from simctl.common.errors import InputError
from simctl.costs.features import plan_features
from simctl.executor.runtime import cpu_name
from simctl.executor.vllm_pinning import PIN_ENV, pinned
from simctl.executor.vllm_runtime import (
    CPU_KV_CACHE_GIB,
    VLLMEngineArgs,
    engine_args,
    require_vllm,
    sampling_params,
    set_vllm_env,
)
from simctl.policies.plan import BatchPlan, packed
from simctl.policies.seq import Seq
from simctl.profiler.sweeps import QUIET_SHARE, Block, summarise_blocks
from simctl.profiler.vllm_grid import VLLM_GRIDS, StepProbe, VLLMGrid, vllm_grid
from simctl.profiler.vllm_served import served_stage
from simctl.profiler.worker import child_protocol

if TYPE_CHECKING:  # vLLM's own types, imported where vLLM runs
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.engine.llm_engine import LLMEngine

    from simctl.profiler.timing import CpuMonitor

# the engine settings recorded in meta.json: the vLLM config field each is read from
_SETTINGS = {"max_model_len": ("model_config", "max_model_len"),
             "max_num_seqs": ("scheduler_config", "max_num_seqs"),
             "max_num_batched_tokens": ("scheduler_config", "max_num_batched_tokens"),
             "enable_chunked_prefill": ("scheduler_config", "enable_chunked_prefill"),
             "async_scheduling": ("scheduler_config", "async_scheduling"),
             "long_prefill_token_threshold": ("scheduler_config", "long_prefill_token_threshold"),
             "block_size": ("cache_config", "block_size"),
             "enable_prefix_caching": ("cache_config", "enable_prefix_caching"),
             "enforce_eager": ("model_config", "enforce_eager")}
MAX_NUM_SEQS, MAX_NUM_BATCHED_TOKENS = 256, 4096
_ENV = ("VLLM_CPU_KVCACHE_SPACE", "VLLM_CPU_OMP_THREADS_BIND", "VLLM_CPU_NUM_OF_RESERVED_CPU",
        "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "VLLM_ENABLE_V1_MULTIPROCESSING", PIN_ENV)


def kind_of(plan: BatchPlan) -> str:
    if plan.decode_only:
        return "decode"
    return "hybrid" if plan.decode_rows else "prefill"


class StepDriver:
    """One in-process vLLM engine, stepped one step at a time; `last` is the plan of the last step run."""

    def __init__(self, engine: LLMEngine, vocab_size: int, seed: int) -> None:
        self.engine = engine
        self.scheduler = engine.engine_core.engine_core.scheduler
        self.full_budget = self.scheduler.max_num_scheduled_tokens
        self.vocab_size = vocab_size
        self.rng = np.random.default_rng(seed)
        self.count = 0
        self.last: BatchPlan | None = None
        schedule = self.scheduler.schedule

        def observed(*args: Any, **kwargs: Any) -> Any:
            out = schedule(*args, **kwargs)
            self.last = self.plan_of(out)
            return out

        self.scheduler.schedule = observed

    def plan_of(self, out: SchedulerOutput) -> BatchPlan:
        """The plan of a `SchedulerOutput`: each scheduled request's tokens on its context before the step."""
        computed = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
        cached = out.scheduled_cached_reqs
        computed.update(zip(cached.req_ids, cached.num_computed_tokens))
        seqs, num_new = [], []
        for i, (rid, q) in enumerate(out.num_scheduled_tokens.items()):
            req = self.scheduler.requests[rid]
            s = Seq(i, 0.0, req.num_prompt_tokens, req.max_tokens)
            s.computed, s.generated = computed[rid], req.num_output_tokens
            if s.computed + q > s.known_tokens:
                raise RuntimeError(f"vLLM scheduled {q} tokens on {s.computed} of {s.known_tokens} known")
            seqs.append(s)
            num_new.append(q)
        return packed(seqs, num_new)

    def add(self, prompt: int, outputs: int) -> str:
        """Submit a request of `prompt` random token ids that generates exactly `outputs` tokens."""
        self.count += 1
        ids = self.rng.integers(1, self.vocab_size, prompt).tolist()
        return self.engine.add_request(str(self.count), {"prompt_token_ids": ids}, sampling_params(outputs))

    def step(self, budget: int | None = None) -> tuple[float, BatchPlan]:
        """Run one engine step with a token budget (default: the engine's); its seconds and its plan."""
        self.scheduler.max_num_scheduled_tokens = min(budget or self.full_budget, self.full_budget)
        self.last = None
        try:
            t0 = time.perf_counter()
            self.engine.step()
            elapsed = time.perf_counter() - t0
        finally:
            self.scheduler.max_num_scheduled_tokens = self.full_budget
        if self.last is None:
            raise RuntimeError("the engine stepped without scheduling")
        return elapsed, self.last

    def abort(self, ids: list[str]) -> None:
        self.engine.abort_request(ids, internal=True)

    def clear(self, ids: list[str]) -> None:
        """Abort `ids` and let the engine empty."""
        self.abort(ids)
        while self.engine.has_unfinished_requests():
            self.engine.step()

    def decode_batch(self, prompts: list[int], outputs: int) -> list[str]:
        """Requests of `prompts` prefilled (untimed, chunked at the engine's budget) until a step decodes them
        all."""
        ids = [self.add(prompt, outputs) for prompt in prompts]
        while True:
            _, plan = self.step()
            if plan.decode_only and plan.decode_rows == len(prompts):
                return ids


def _check(probe: StepProbe, plan: BatchPlan) -> None:
    chunk = ([probe.chunk], [probe.cached]) if probe.chunk else ([], [])
    sampled = probe.decodes + (1 if probe.chunk and probe.sample else 0)
    if (plan.decode_rows, (plan.prefill_q, plan.prefill_c),
        plan.sampled_tokens) != (probe.decodes, chunk, sampled):
        raise RuntimeError(f"{probe.label()}: vLLM scheduled {plan.decode_rows} decodes and chunks "
                           f"{plan.prefill_q} on {plan.prefill_c} ({plan.sampled_tokens} sampled)")


def cohort_lengths(probe: StepProbe, timed: int, budget: int) -> tuple[int, int]:
    """Prompt (the middle one, with a spread) and output tokens of `probe`'s decode requests: the first step
    decoding them all is untimed (warm-up) and the middle timed one is at `context`; the first prefilled
    decode while the others are prefilled (chunks of `budget`), so outputs leave room for those steps too
    (none finishes in a timed one)."""
    per_rep = 1 + (probe.cached > 0) if probe.chunk else 1  # decode steps per repetition
    prompt = max(1, probe.context - 1 - (per_rep * timed) // 2)
    return prompt, per_rep * timed + -(-probe.decodes * (prompt + probe.spread) // budget) + 4


def cohort_prompts(probe: StepProbe, prompt: int) -> list[int]:
    """The decode requests' prompts: `prompt` each, or spread evenly over prompt -+ the probe's spread."""
    if not probe.spread:
        return [prompt] * probe.decodes
    lo, hi = max(1, prompt - probe.spread), prompt + probe.spread
    return [round(lo + (hi - lo) * i / max(1, probe.decodes - 1)) for i in range(probe.decodes)]


def run_probe(d: StepDriver, probe: StepProbe, timed: int) -> tuple[list[float], list[BatchPlan]]:
    """One visit: `timed` steps of `probe`'s shape, each timed; their seconds and plans."""
    times: list[float] = []
    plans: list[BatchPlan] = []
    cohort: list[str] = []
    if probe.decodes:
        prompt, outputs = cohort_lengths(probe, timed, d.full_budget)
        cohort = d.decode_batch(cohort_prompts(probe, prompt), outputs)
    for _ in range(timed):
        if probe.chunk:
            rid = d.add(probe.cached + probe.chunk + (0 if probe.sample else 8), 2)
            if probe.cached:
                d.step(probe.decodes + probe.cached)
            t, plan = d.step(probe.decodes + probe.chunk)
            d.abort([rid])
        else:
            t, plan = d.step()
        _check(probe, plan)
        times.append(t)
        plans.append(plan)
    d.clear(cohort)
    return times, plans


def _row(probe: StepProbe, plan: BatchPlan) -> dict[str, Any]:
    if kind_of(plan) != probe.kind:
        raise RuntimeError(f"{probe.label()}: scheduled as a {kind_of(plan)} step")
    if probe.chunk:
        q, c = probe.chunk, probe.cached
    else:
        q, c = 1, max(s.computed for s in plan.seqs)
    # The few tokens by which a single-context probe's rows differ are not a padding measurement (a fit of
    # them alone priced the twin's mixed-context decode steps 1.7x over served vLLM's): recorded as none; the
    # spread probes' padding is what they measure
    features = plan_features(plan)
    return {"kind": probe.kind, **features, "decode_pad_kv": features["decode_pad_kv"] if probe.spread else 0,
            "q": q, "c": c}


class VLLMWorker:
    def __init__(self, model: str, dtype: str, grid: str, seed: int, out: TextIO) -> None:
        from simctl.catalogue.models import get_model

        if grid not in VLLM_GRIDS:
            raise InputError(f"grid {grid!r} unknown; choose one of {', '.join(VLLM_GRIDS)}")
        self.spec = get_model(model)
        self.dtype = dtype
        self.grid: VLLMGrid = vllm_grid(grid, self.spec.moe)
        self.seed = seed
        self.out = out

    def emit(self, **msg: Any) -> None:
        self.out.write(json.dumps(msg) + "\n")
        self.out.flush()

    def run(self) -> None:
        """Start the engine, time the grid, emit its rows and the profile's meta (the module docstring)."""
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, stepped by us
        set_vllm_env("cpu")
        version = require_vllm()
        from simctl.profiler.timing import CpuMonitor

        self._check_lengths()
        t_start = time.perf_counter()
        engine, settings = self._start_engine()
        engine_start_s = time.perf_counter() - t_start
        with pinned(os.getpid()) as roles:  # as served vLLM runs (SIMCTL_VLLM_PIN)
            d = StepDriver(engine, self.spec.vocab_size, self.seed)
            run_probe(d, StepProbe("decode", 8, 64), 4)  # warm-up: thread pools, allocator, first kernels
            n = len(self.grid.probes)
            self.emit(event="start", shapes=n, total=n * self.grid.blocks, skipped=[])
            executor = engine.engine_core.engine_core.model_executor
            monitor = CpuMonitor(own=tuple(w.proc.pid for w in executor.workers))  # its model worker's CPU
            blocks, plans = self._time_grid(d, monitor)
            timings, timing = summarise_blocks(blocks, self.grid, monitor)
            monitor.close()
            threads = engine.engine_core.engine_core.collective_rpc(_torch_threads)[0]  # the model worker's
            engine.engine_core.shutdown()
        settings = {**settings, "pinned": sorted(roles.values())}
        for i, (probe, plan, tm) in enumerate(zip(self.grid.probes, plans, timings)):
            self.emit(event="row", index=i, label=probe.label(), row={**_row(probe, plan), **tm})
        meta = {**self._meta(version, settings, threads), "timing": timing,
                "engine_start_s": round(engine_start_s, 3), "wall_s": round(time.perf_counter() - t_start, 3)}
        self.emit(event="done", meta=meta)

    def _check_lengths(self) -> None:
        """InputError if the model holds too few positions for a probe of the grid."""
        grid, max_len = self.grid, self.spec.max_position
        too_long = [p.label() for p in grid.probes
                    if max(sum(cohort_lengths(p, grid.timed, MAX_NUM_BATCHED_TOKENS)) + p.spread,
                           p.cached + p.chunk + 10) > max_len]
        if too_long:
            raise InputError(f"model {self.spec.name!r} holds {max_len} positions; too few for {too_long[0]}")

    def _start_engine(self) -> tuple[Any, dict[str, Any]]:
        """The in-process engine core with a multiprocess model worker, and its settings as vLLM resolved
        them (a setting under which steps cannot be timed one by one is an error)."""
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        from simctl.executor.vllm_runtime import vllm_model_dir

        with vllm_model_dir(self.spec, self.dtype) as model_dir:
            # the largest steps the grid makes (vLLM's `LLM` defaults on a CPU); a step's cost does not depend
            # on these caps, only the shapes they allow
            given = VLLMEngineArgs(max_model_len=self.spec.max_position, dtype=self.dtype,
                                   max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=MAX_NUM_BATCHED_TOKENS,
                                   enable_prefix_caching=False, seed=self.seed)
            engine = LLMEngine.from_engine_args(EngineArgs(**engine_args(model_dir, given),
                                                           distributed_executor_backend="mp",
                                                           disable_log_stats=True))
        config = engine.vllm_config
        settings = {k: getattr(getattr(config, part), name) for k, (part, name) in _SETTINGS.items()}
        if settings["async_scheduling"] or settings["enable_prefix_caching"]:
            raise RuntimeError(f"the engine runs with {settings}: steps could not be timed one by one")
        return engine, settings

    def _time_grid(self, d: StepDriver, monitor: CpuMonitor) -> tuple[list[list[Block]], list[BatchPlan]]:
        """Every probe visited once a sweep, in a seeded random order each sweep: each visit's block (its
        steps' times and the foreign CPU meanwhile), and each probe's plan (its first visit's middle step)."""
        grid, n = self.grid, len(self.grid.probes)
        blocks: list[list[Block]] = [[] for _ in range(n)]
        plans: list[BatchPlan | None] = [None] * n
        rng = np.random.default_rng(self.seed)
        done = 0
        for _ in range(grid.blocks):
            for i in rng.permutation(n):
                probe = grid.probes[i]
                r0, w0 = monitor.read(), time.perf_counter()
                times, steps = run_probe(d, probe, grid.timed)
                r1, wall = monitor.read(), time.perf_counter() - w0
                blocks[i].append(Block(times, monitor.foreign_share(r0, r1, wall),
                                       monitor.quiet(r0, r1, wall, QUIET_SHARE)))
                if plans[i] is None:
                    plans[i] = steps[len(steps) // 2]
                done += 1
                self.emit(event="progress", done=done, total=n * grid.blocks, label=probe.label(),
                          time_s=float(np.median([t for b in blocks[i] for t in b.times])))
        if any(p is None for p in plans):
            raise RuntimeError("a probe of the grid was never visited")
        return blocks, [p for p in plans if p is not None]

    def _meta(self, version: str, settings: dict[str, Any], threads: int) -> dict[str, Any]:
        """What meta.json records of the engine, the machine and the grid (the timing added by `run`)."""
        return {
            "model": self.spec.name,
            "model_shape": asdict(self.spec),
            "engine": "vllm",
            "vllm_version": version,
            "device": "cpu",
            "device_name": cpu_name(),
            "dtype": self.dtype,
            "engine_settings": {**settings, "kv_cache_gib": CPU_KV_CACHE_GIB,
                                "executor": "mp: engine core in the profiler, model worker a process"},
            "environment": {k: os.environ.get(k) for k in _ENV},
            "timed": "LLMEngine.step() wall time: scheduling, input preparation, forward, sampling, output "
                     "processing (vLLM's host overhead included)",
            "threads": threads,
            "python_version": platform.python_version(),
            "platform": platform.platform(),
            "cpu_count": os.cpu_count(),
            "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
            "grid": self.grid.name,
            "seed": self.seed,
            "blocks": self.grid.blocks,
            "timed_steps_per_block": self.grid.timed,
            "num_shapes": len(self.grid.probes),
        }


def _torch_threads(_worker: Any = None) -> int:
    """The calling process's torch threads (called in vLLM's model worker)."""
    import torch

    return torch.get_num_threads()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m simctl.profiler.vllm_worker")
    p.add_argument("--model", required=True)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--grid", default="full")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--stage", choices=("grid", "served"), default="grid")
    args = p.parse_args(argv)

    def body(out: TextIO) -> None:
        if args.stage == "served":
            served_stage(args.model, args.dtype, args.grid, args.seed, out)
        else:
            VLLMWorker(args.model, args.dtype, args.grid, args.seed, out).run()

    return child_protocol(body)


if __name__ == "__main__":
    sys.exit(main())
