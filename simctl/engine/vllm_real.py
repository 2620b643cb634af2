"""`simctl real --engine vllm`: a simctl trace served by the installed vLLM (`AsyncLLM` in this process; its
engine core and model worker are processes of their own), written as simctl's own real runs are
(`results.output.write_run`, the summary of `results.metrics.summarise_result`), so TTFT, TBT, TPOT and E2E
are computed by the same code.

    with VLLMServer("tiny", vllm_args_for("tiny", seed=0, settings={})) as server:   # 20-35 s on a CPU
        for requests in runs:
            run = server.serve(requests)                     # prefix cache reset before each run

The engine is warmed up once (a few requests) before its first run, as simctl's own engine is before its
clock starts. Each request is submitted on the monotonic clock when `serving.clients.Clients` says
(`engine.vllm_clients`: at its arrival, or when a closed-loop client is free, a session's later turn after the
turn before it completed), with deterministic random prompt ids (`traces.tokens.SessionPrompts`: shared only
within a prefix group or where Mooncake hash ids are equal; a later turn resends its session's context, the
ids vLLM generated included), and asks for exactly its output length (greedy, EOS ignored); every request
is checked to have got exactly that many tokens. What each engine step did and when every token came is
recorded by a stat logger (`simctl.engine.vllm_steps`).

vLLM's settings are those of the `vllm-v1` policy, its simulated twin (VLLM_SETTINGS). The summary holds what
the twin needs: the trace's parameters as `simctl real` records them, `policy: vllm-v1` and its settings as
vLLM resolved them, the KV cache as `kv_capacity_tokens` (so `validation.twin.twin_policy(summary)` builds
it), and vLLM's own names and numbers (KV blocks, block size, version), with `not_recorded` saying what vLLM
does not expose."""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self

import numpy as np
import pandas as pd

from simctl.catalogue.models import get_model
from simctl.common.checks import is_int
from simctl.common.errors import InputError
from simctl.engine.setup import REAL_WORKLOAD, RealConfig
from simctl.engine.vllm_clients import VLLMClients
from simctl.engine.vllm_output import EngineOutput
from simctl.engine.vllm_steps import StepLog, step_recorder
from simctl.executor.vllm_pinning import pinned
from simctl.executor.vllm_runtime import (
    VLLMEngineArgs,
    engine_args,
    require_vllm,
    set_vllm_env,
    vllm_model_dir,
)
from simctl.policies.admission import FCFS
from simctl.policies.registry import check_options, policy_class
from simctl.policies.vllm_v1 import DEVICE_DEFAULTS, DEVICE_SETTINGS
from simctl.results.run_result import SimResult
from simctl.serving.clients import Clients
from simctl.serving.records import request_columns
from simctl.traces.request import Request
from simctl.traces.tokens import SessionPrompts
from simctl.traces.workload import Workload

if TYPE_CHECKING:  # imported only where vLLM runs
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

TWIN_POLICY = "vllm-v1"  # the simulator's model of vLLM's scheduler: its settings are the engine's
# vLLM's settings simctl passes through: vLLM's name by the name of the vllm-v1 setting that models it
VLLM_SETTINGS = {"max_batch_size": "max_num_seqs", "max_num_batched_tokens": "max_num_batched_tokens",
                 "block_size": "block_size", "enable_prefix_caching": "enable_prefix_caching",
                 "long_prefill_token_threshold": "long_prefill_token_threshold"}
# vLLM's KV block size on the CPU when none is given (the vllm-v1 twin's device default)
CPU_BLOCK_SIZE = dict(zip(DEVICE_SETTINGS, DEVICE_DEFAULTS["cpu"]))["block_size"]
# How vLLM's CPU build places its threads, read when it starts its model worker. The default, "auto", keeps
# one core per worker for the engine core's scheduler and this process (VLLM_CPU_NUM_OF_RESERVED_CPU unset)
# and binds the worker's OpenMP threads to the others: on 2 cores, the model runs on one thread of its own
# and the busy scheduler and the client share the other instead of preempting the model's threads.
THREAD_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "auto", "VLLM_CPU_NUM_OF_RESERVED_CPU": None}
ENGINE_FAILED = "vLLM's engine did not start"
WARM_UP = [Request(i, 0.0, 64 * (i + 1), 8) for i in range(4)]  # first calls of prefill and decode shapes
NOT_RECORDED = [
    ("iterations duration_s is each step's model execution as vLLM's engine core times it (elapsed_ms); its "
     "scheduling and output processing fall between rows and are not timed"),
    "iterations kv_used_tokens are the KV blocks in use after each step (blocks x block_size), not during it",
    "queue_at_arrival counts requests whose first scheduling had not yet reached this process",
    "no forward times, attention kernels or per-iteration membership (vLLM exposes none of them per step)",
]


@dataclass
class VLLMRun:
    """One run's records in the simulator's form, and what only a vLLM run has."""

    requests: list[Request]
    result: SimResult
    fields: dict[str, Any]  # prefix-cache counts, submission lag, rows ended at this process
    members: list[list[tuple[int, int]]] | None = None  # `StepLog.members`, when asked for


class VLLMServer:
    """The installed vLLM on a catalogue model shape (random weights), started once and serving several runs
    in a row: `serve(requests)` resets the prefix cache, then serves in real time. A context manager: the
    engine's processes end on leaving it."""

    def __init__(self, model: str, args: VLLMEngineArgs, device: str = "cpu") -> None:
        self.spec = get_model(model)
        self.args = args
        self.device = device
        set_vllm_env(device)  # before vLLM is first imported: its logging is set up then
        self.output = EngineOutput()  # vLLM's warnings, shown only if it fails
        try:
            with self.output.held():
                self.version = require_vllm()
        except BaseException:
            self.output.close()
            raise
        self._logs: list[StepLog] = []  # the run in progress, fed by the engine's stat logger
        self._stack = ExitStack()
        self._stack.callback(self.output.close)
        self.llm: AsyncLLM | None = None
        self.engine_start_s = 0.0
        self.warmup_s = 0.0
        self.pinned: dict[int, str] = {}  # the processes `executor.vllm_pinning` pinned, by pid: their role

    def __enter__(self) -> Self:
        self._loop = asyncio.new_event_loop()
        self._stack.callback(self._close_loop)
        try:
            with self.output.held():
                self._start_and_warm_up()
        except BaseException as e:
            if not isinstance(e, InputError) or e.args[0].startswith(ENGINE_FAILED):
                self.output.show()  # a crash, or an engine that did not start: the reason is in vLLM's output
            self._stack.close()
            raise
        return self

    def _start_and_warm_up(self) -> None:
        from vllm.engine.arg_utils import AsyncEngineArgs

        model_dir = self._stack.enter_context(vllm_model_dir(self.spec, self.args.dtype))
        t0 = time.perf_counter()
        self.llm = self._start(AsyncEngineArgs(**engine_args(model_dir, self.args),
                                               disable_log_stats=True, enable_logging_iteration_details=True))
        self._stack.callback(self._shutdown)
        self.pinned = self._stack.enter_context(pinned(os.getpid()))  # SIMCTL_VLLM_PIN
        self.engine_start_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        self.serve(WARM_UP)  # as simctl's own engine warms up before its clock starts
        self.warmup_s = time.perf_counter() - t0

    def _start(self, args: AsyncEngineArgs) -> AsyncLLM:
        """The started AsyncLLM; InputError, in one line, for settings vLLM refuses or an engine that
        failed."""
        from vllm.v1.engine.async_llm import AsyncLLM

        async def start() -> AsyncLLM:  # AsyncLLM starts its output handler on the running loop
            return AsyncLLM.from_engine_args(args, stat_loggers=[step_recorder(self._logs)])

        try:
            return self._loop.run_until_complete(start())
        except ValueError as e:  # vLLM's checks of its settings, most of them pydantic's ValidationError
            why = e.errors()[0]["msg"] if hasattr(e, "errors") else str(e).strip().splitlines()[0]
            raise InputError(f"vLLM refused its settings: {why}") from None
        except RuntimeError as e:  # its engine process failed: the reason is in its output (shown)
            raise InputError(f"{ENGINE_FAILED}: {str(e).strip().splitlines()[0]}") from None

    def _close_loop(self) -> None:
        """Let the engine's tasks (output handler, socket reader) end before the loop closes, quietly."""
        tasks = asyncio.all_tasks(self._loop)
        for task in tasks:
            task.cancel()

        async def ended() -> None:
            await asyncio.gather(*tasks, return_exceptions=True)

        self._loop.run_until_complete(ended())
        self._loop.close()

    def _shutdown(self) -> None:
        with self.output.held():  # its process manager says it killed the engine core: a normal stop
            self.llm.shutdown()
        self.llm = None  # collected now, not at interpreter exit, where its own shutdown fails

    def __exit__(self, *exc: object) -> None:
        self._stack.close()

    def settings(self) -> dict[str, Any]:
        """The engine's settings as vLLM resolved them: what a simulated twin must be configured with."""
        config = self.llm.vllm_config
        cache, sched = config.cache_config, config.scheduler_config
        return {
            "engine": "vllm",
            "vllm_version": self.version,
            "num_gpu_blocks": cache.num_gpu_blocks,
            "block_size": cache.block_size,
            # the blocks requests can hold: vLLM's block pool sets one aside as its null block
            # (vllm/v1/core/block_pool.py), which the twin's pool does not have
            "kv_cache_tokens": (cache.num_gpu_blocks - 1) * cache.block_size,
            "max_num_seqs": sched.max_num_seqs,
            "max_num_batched_tokens": sched.max_num_batched_tokens,
            "enable_chunked_prefill": sched.enable_chunked_prefill,
            "long_prefill_token_threshold": sched.long_prefill_token_threshold,
            "enable_prefix_caching": int(cache.enable_prefix_caching),  # 0 or 1, as vllm-v1's setting
            "max_model_len": config.model_config.max_model_len,
            # the simulated twin: `validation.twin.twin_policy(summary)` builds vllm-v1 on kv_capacity_tokens
            # with these settings (its max_batch_size is vLLM's max_num_seqs; the others have vLLM's names)
            "policy": TWIN_POLICY,
            "max_batch_size": sched.max_num_seqs,
            "dtype": str(config.model_config.dtype).removeprefix("torch."),
            "enforce_eager": config.model_config.enforce_eager,
            "engine_start_s": self.engine_start_s,
            "warmup_s": self.warmup_s,
            "cpu_cores": len(os.sched_getaffinity(0)),
            **{k: os.environ.get(k, default) for k, default in THREAD_ENV.items()},
            "pinned": sorted(self.pinned.values()),
        }

    def check(self, requests: list[Request]) -> None:
        """InputError, in one line, for a request this engine cannot serve."""
        longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
        need = longest.prompt_tokens + longest.output_tokens
        settings = self.settings()
        if need > settings["max_model_len"]:
            raise InputError(f"request {longest.id} needs {need} tokens but vLLM's max_model_len is "
                             f"{settings['max_model_len']}; lower --scale")
        block = settings["block_size"]
        blocks, held = math.ceil(need / block), settings["kv_cache_tokens"] // block
        if blocks > held:
            raise InputError(f"request {longest.id} needs {blocks} KV blocks of {settings['block_size']} "
                             f"tokens but vLLM's cache holds {held}; lower --scale")

    def serve(self, requests: list[Request], seed: int = 0, members: bool = False,
              concurrency: int | None = None, think_s: float = 0.0) -> VLLMRun:
        """Serve `requests` (sorted by arrival; arrival_s in seconds from now) in real time, sent when
        `serving.clients.Clients` says (`concurrency` clients pausing `think_s` after each response; None:
        open loop), a session's later turn resending its context (`engine.vllm_clients`); RuntimeError if a
        request did not get exactly its output tokens or the records do not add up. `members`: also record
        which requests each step gave a token (`StepLog.members`)."""
        self.check(requests)
        prompts = SessionPrompts(requests, self.spec.vocab_size, seed)
        settings = self.settings()
        self._loop.run_until_complete(self.llm.reset_prefix_cache())
        t0 = time.monotonic()
        log = StepLog(t0, self.llm.output_processor.request_states, settings["block_size"],
                      settings["kv_cache_tokens"] // settings["block_size"], members=[] if members else None)
        self._logs[:] = [log]
        clients = VLLMClients(self.llm, log, prompts, Clients(requests, concurrency, think_s))
        try:
            done = self._loop.run_until_complete(clients.run(requests))
        finally:
            self._logs.clear()
        wall_s = time.monotonic() - t0
        _check(requests, [n for _, n, _ in done], log)
        columns = {**request_columns([s for s, _, _ in done]),
                   "prefix_cached_tokens": np.asarray([c for _, _, c in done], dtype=np.int64)}
        records = log.records
        result = SimResult(request_columns=columns, iterations=records.iterations, gaps=records.gaps,
                           queue_at_arrival=records.queue_lengths(), aborted=False,
                           kv_capacity=settings["kv_cache_tokens"], wall_s=wall_s)
        return VLLMRun(requests, result, {
            **policy_class(TWIN_POLICY).summarise_stats(log.prefix_cache),  # named and rated as the twin's
            "submit_lag_max_s": clients.lag,
            "iteration_ends_from_client": log.ends_from_client,
        }, log.members)


def _check(requests: list[Request], tokens: list[int], log: StepLog) -> None:
    wrong = [(r.id, n, r.output_tokens) for r, n in zip(requests, tokens) if n != r.output_tokens]
    if wrong:
        raise RuntimeError("requests did not get exactly their output tokens (id, got, asked): "
                           + str(wrong[:5]))
    if log.skipped_tokens:
        raise RuntimeError(f"{log.skipped_tokens} tokens came more than one per request and step: their "
                           "times are unknown")
    expected = sum(r.output_tokens for r in requests)
    if log.generated != expected:
        raise RuntimeError(f"vLLM's steps sampled {log.generated} tokens, the requests asked for {expected}")


def run_summary(config: RealConfig, server: VLLMServer, run: VLLMRun, wall_s: float) -> dict[str, Any]:
    """summary.json of a vLLM run: the trace's parameters as `simctl real` records them, the metrics of
    `simctl.results.metrics.summarise_result`, the engine's settings, and what could not be recorded."""
    from simctl.executor.runtime import cpu_name
    from simctl.results.cluster_summary import replica_row
    from simctl.results.metrics import summarise_result
    from simctl.traces.build import has_arrival_times

    metrics = summarise_result(run.result)
    # one replica, as simctl's own real runs record theirs (replicas.parquet)
    replica = replica_row("replicas", 0, "cpu", metrics, run.result.iterations, run.result.queue_at_arrival,
                          metrics["makespan_s"])
    return {"mode": "real", **config.workload.recorded(), "model": config.model, "device": config.device,
            **metrics, **server.settings(), **run.fields,
            "arrivals_from_file": has_arrival_times(config.workload.trace), "gpu": "cpu", "tp": 1,
            "device_name": cpu_name(), "max_seq_len": server.settings()["max_model_len"],
            "not_recorded": NOT_RECORDED, "real_wall_s": wall_s, "replica_metrics": [replica]}


def vllm_real_main(*, workload: Workload = REAL_WORKLOAD, model: str = "tiny", out: str | Path | None = None,
                   dtype: str = "float32", settings: dict[str, int | None] | None = None,
                   kv_capacity: int | None = None) -> dict[str, Any]:
    """What `simctl real --engine vllm` does: check the options and the trace, start vLLM, serve, write `out`
    (summary.json, requests.parquet, iterations.parquet, replicas.parquet) if given, and return the summary.
    `settings`: vLLM's own, by vLLM's names (`engine_settings` makes them from vllm-v1's; None keeps vLLM's
    default). `kv_capacity`: the tokens vLLM's KV cache holds for requests (`vllm_args_for`; None: vLLM sizes
    it). InputError in one line for what cannot run."""
    from simctl.engine.setup import DEFAULT_NUM_REQUESTS, DEFAULT_QPS
    from simctl.results.output import CLUSTER_RUN_FILES, check_out_dir, write_cluster_files

    t0 = time.perf_counter()
    # the trace's options checked as `simctl real` checks them (its policy is only a placeholder here)
    config = RealConfig(policy="vllm", workload=workload.resolved(DEFAULT_QPS, DEFAULT_NUM_REQUESTS),
                        model=model, dtype=dtype)
    config.validate()
    seed = config.workload.seed
    args = vllm_args_for(config.model, seed, settings or {}, config.dtype, kv_capacity)
    requests = config.workload.requests()
    get_model(config.model).check_context(requests, config.workload.scale)
    out_path = check_out_dir(Path(out), CLUSTER_RUN_FILES) if out is not None else None
    with VLLMServer(config.model, args) as server:
        run = server.serve(requests, seed, concurrency=config.workload.concurrency,
                           think_s=config.workload.think_time)
        summary = run_summary(config, server, run, time.perf_counter() - t0)
    if out_path is not None:
        write_cluster_files(out_path, summary, run.result.requests, run.result.iterations.frame(),
                            pd.DataFrame(summary["replica_metrics"]))
    return summary


def engine_settings(options: Mapping[str, Any]) -> dict[str, int]:
    """vLLM's settings (its names) from the vllm-v1 policy's settings given (None: not given, vLLM's default);
    InputError for another policy's setting or a value vllm-v1 refuses."""
    given = {k: v for k, v in options.items() if v is not None}
    check_options(TWIN_POLICY, given)
    if given.pop("admission", FCFS) != FCFS:  # vLLM has no shortest-first; its priority is not passed through
        raise InputError("--admission: the real vLLM is served in arrival order (fcfs) only")
    return {VLLM_SETTINGS[k]: int(v) for k, v in given.items()}


def vllm_args_for(model: str, seed: int, settings: Mapping[str, int | None], dtype: str = "float32",
                   kv_capacity: int | None = None) -> VLLMEngineArgs:
    """The engine of `model` (max_model_len: its context) with vLLM's `settings` (vLLM's names; None or
    missing: vLLM's default), checked as vllm-v1 checks its own. `kv_capacity` (tokens): a KV cache of its
    whole blocks for requests plus vLLM's null block (None: vLLM sizes it from the memory); smaller than the
    model's context, it is max_model_len too (vLLM refuses a cache that cannot hold one request that long,
    `kv_cache_utils._check_enough_kv_cache_memory`)."""
    ours = {v: k for k, v in VLLM_SETTINGS.items()}
    unknown = sorted(set(settings) - set(ours))
    if unknown:
        raise InputError(f"{unknown[0]} is not a vLLM setting simctl passes through ({', '.join(ours)})")
    given = engine_settings({ours[k]: v for k, v in settings.items()})
    if "enable_prefix_caching" in given:
        given["enable_prefix_caching"] = bool(given["enable_prefix_caching"])
    max_model_len = get_model(model).max_position
    if kv_capacity is not None:
        block = given.get("block_size", CPU_BLOCK_SIZE)
        if not is_int(kv_capacity) or kv_capacity < block:
            raise InputError(f"--kv-capacity must be an integer of at least one KV block ({block} tokens), "
                             f"got {kv_capacity!r}")
        given["num_gpu_blocks"] = kv_capacity // block + 1
        max_model_len = min(max_model_len, kv_capacity // block * block)
    return VLLMEngineArgs(max_model_len=max_model_len, dtype=dtype, seed=seed, **given)
