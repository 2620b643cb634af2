"""What a run on vLLM records, step by step, into simctl's own records (`serving.records`): one iteration row
per engine step and every token's time.

vLLM calls a stat logger's `record` once per engine step, in its output handler, right after that step's
outputs were processed (`vllm/v1/engine/async_llm.py`). `StepLog.step` is fed from there:

- the iteration row comes from the step's `SchedulerStats.iteration_details` (the engine is started with
  `enable_logging_iteration_details`): prefill ("context") and decode ("generation") tokens and requests, and
  `elapsed_ms`, the step's model execution as the engine core timed it. The row ends at the step's engine-core
  timestamp (`RequestStateStats.last_token_ts` of the requests that got a token; a step that sampled nothing,
  a mid-prompt chunk alone, ends when its outputs reached this process) and lasts `elapsed_ms`: scheduling and
  output processing fall between rows. `kv_used_tokens` is the KV blocks in use after the step, in tokens.
- every request's tokens: each step, every request in flight whose generated count moved gets its new token
  at the step's timestamp (`RequestStateStats`, the live object vLLM updates), so token gaps go into the same
  histogram the simulator fills, and per-request first token, last token, first scheduled, preemptions and
  longest gap are known. vLLM samples one token per request per step here (no speculative decoding): a count
  that moves by more than one is an error, checked at the end.

Engine-core timestamps are `time.monotonic()` in the engine's process, the same clock as this process's on
Linux, so they are put on the run's time axis by subtracting the run's start.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from simctl.policies.seq import Seq
from simctl.serving.records import Records

if TYPE_CHECKING:  # vLLM's own types, imported only where vLLM runs
    from vllm.config import VllmConfig
    from vllm.v1.metrics.loggers import StatLoggerBase
    from vllm.v1.metrics.stats import IterationStats, MultiModalCacheStats, RequestStateStats, SchedulerStats


@dataclass
class _Track:
    seq: Seq
    stats: RequestStateStats | None = None  # once the request is in vLLM's output processor
    seen: int = 0  # tokens recorded so far


@dataclass
class StepLog:
    """The records of one run: `open` a request when it is submitted, `step` every engine step, `close` it
    with its final output's stats."""

    t0: float  # the run's start on the monotonic clock
    live: dict[str, Any]  # vLLM's in-flight request states (its output processor's `request_states`)
    block_tokens: int  # tokens per KV block
    num_blocks: int
    records: Records = field(default_factory=Records)
    tracks: dict[str, _Track] = field(default_factory=dict)  # open requests by vLLM's (external) request id
    generated: int = 0  # tokens vLLM reported sampled (IterationStats), to check against the requests
    # prompt tokens looked up in the prefix cache and found, under the names the vllm-v1 policy's stats use
    # (fresh requests; preempted ones coming back counted apart, as vLLM does)
    prefix_cache: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("prefix_cache_hits", "prefix_cache_queries", "prefix_cache_preempted_hits",
         "prefix_cache_preempted_queries"), 0))
    ends_from_client: int = 0  # rows whose step sampled nothing: ended at their outputs' arrival here
    skipped_tokens: int = 0  # tokens that arrived more than one per step (never expected)
    # when a list: per iteration row, each request that got a token in that step, as (id, tokens it had
    # before the step); a profiler's served stream reads each step's shape back from it
    members: list[list[tuple[int, int]]] | None = None

    def open(self, seq: Seq) -> None:
        self.tracks[str(seq.id)] = _Track(seq)
        waiting = sum(1 for t in self.tracks.values() if t.seq.first_scheduled_s < 0)
        self.records.queue_at_arrival.append(waiting)  # as far as this process knows; arrival included

    def close(self, request_id: str, stats: RequestStateStats) -> Seq:
        """The request's final output arrived with `stats`: record what it did since the last step."""
        track = self.tracks.pop(request_id)
        track.stats = stats
        self._advance(track)
        track.seq.completion_s = track.seq.last_token_s
        return track.seq

    def step(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None) -> None:
        arrived = time.monotonic()
        if iteration_stats is not None:
            self.generated += iteration_stats.num_generation_tokens
        for state in self.live.values():
            track = self.tracks.get(state.external_req_id)
            if track is not None and track.stats is None:
                track.stats = state.stats
        before = {id(t): t.seen for t in self.tracks.values()} if self.members is not None else {}
        ends = [t for t in (self._advance(t) for t in self.tracks.values() if t.stats is not None)
                if t is not None]
        end = max(ends, default=None)
        if scheduler_stats is None:
            return
        cache, totals = scheduler_stats.prefix_cache_stats, self.prefix_cache
        totals["prefix_cache_hits"] += cache.hits
        totals["prefix_cache_queries"] += cache.queries
        totals["prefix_cache_preempted_hits"] += cache.preempted_hits
        totals["prefix_cache_preempted_queries"] += cache.preempted_queries
        details = scheduler_stats.iteration_details
        if details is None or details.is_dummy:  # a step that scheduled nothing
            return
        if end is None:
            end = arrived
            self.ends_from_client += 1
        duration = details.elapsed_ms / 1000
        prefill, decode = details.num_ctx_tokens, details.num_generation_tokens
        kv_used = round(scheduler_stats.kv_cache_usage * self.num_blocks) * self.block_tokens
        self.records.iterations.add(end - self.t0 - duration, duration, 1, prefill, decode,
                                    details.num_ctx_requests + details.num_generation_requests, prefill
                                    + decode, kv_used)
        if self.members is not None:
            self.members.append([(t.seq.id, before[id(t)]) for t in self.tracks.values()
                                 if id(t) in before and t.seen != before[id(t)]])

    def _advance(self, track: _Track) -> float | None:
        """Record the tokens `track` got since it was last seen; the engine-core time of the latest, if
        any."""
        stats, seq = track.stats, track.seq
        if seq.first_scheduled_s < 0 < stats.scheduled_ts:
            seq.first_scheduled_s = stats.scheduled_ts - self.t0
        seq.preemptions = stats.num_preemptions
        n = stats.num_generation_tokens
        if n == track.seen:
            return None
        self.skipped_tokens += n - track.seen - 1
        t = stats.last_token_ts - self.t0
        if track.seen == 0:
            seq.first_token_s = t
        else:
            gap = t - seq.last_token_s
            self.records.gaps.add(gap, 1)
            seq.max_gap_s = max(seq.max_gap_s, gap)
        seq.last_token_s, seq.generated, track.seen = t, n, n
        return stats.last_token_ts


def step_recorder(log_holder: list[StepLog]) -> type[StatLoggerBase]:
    """A vLLM stat logger factory whose loggers feed `log_holder[0]` (the run in progress, if any): one engine
    serves several runs, each with its own StepLog."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class StepRecorder(StatLoggerBase):
        def __init__(self, vllm_config: VllmConfig, engine_index: int = 0) -> None:
            self.vllm_config = vllm_config

        def record(self, scheduler_stats: SchedulerStats | None, iteration_stats: IterationStats | None,
                   mm_cache_stats: MultiModalCacheStats | None = None, engine_idx: int = 0) -> None:
            if log_holder:
                log_holder[0].step(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return StepRecorder
