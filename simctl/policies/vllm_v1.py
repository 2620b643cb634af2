"""vLLM v1's scheduler as the installed vLLM 0.32 implements it (vllm/v1/core/sched/scheduler.py:
`Scheduler.schedule`, FCFS or priority, no speculative decoding, no KV connector, synchronous scheduling).

There is no prefill or decode phase: every step has one token budget (`max_num_batched_tokens`). First the
running requests, in the order they were admitted, each take min(tokens it has left to compute, budget left)
tokens (capped by `long_prefill_token_threshold` when it is set and more than one request is running or
waiting): a decode takes one, an ongoing prefill a chunk. A running request whose blocks cannot be allocated
preempts the running request the admission order ranks last (FCFS: the last admitted; priority: the lowest
priority, then the latest arrival, its tokens of this step given back if it was already scheduled) by
recompute (its blocks freed, back in the waiting queue: at its front under FCFS), and retries, until it fits
or preempts itself; the pass over the running requests stops there. Then, only if
nobody was preempted this step, waiting requests are admitted in order while budget and `max_num_seqs` allow
and KV fits their whole known sequence (`scheduler_reserve_full_isl`), prefix-cache hits counted; each takes
the rest of its prompt up to the budget left (chunked prefill is always on). The first one that does not fit
stops admission. Requests that arrived with their KV (a disaggregated decode instance) are admitted first, as
vLLM drains its KV-holding waiting queue first. KV: `simctl.policies.prefix_kv.PrefixCachingKV`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simctl.common.errors import InputError
from simctl.policies.base import Policy, Settings, option
from simctl.policies.plan import BatchPlan, packed
from simctl.policies.prefix_kv import PrefixCachingKV
from simctl.policies.seq import Phase, Seq

# vLLM's defaults for a serving engine (`vllm serve`, which `vllm bench serve` measures, and an AsyncLLM)
# where the user sets none (vllm/engine/arg_utils.py: get_batch_defaults, UsageContext.OPENAI_API_SERVER:
# GPUs of 70-160 GiB other than the A100 get 8192 tokens and 1024 sequences; vllm/config/cache.py:
# DEFAULT_BLOCK_SIZE 16; vllm/platforms/cpu.py: block size 128, 2048 tokens, 128 sequences), by catalogue
# device:
# (max_num_batched_tokens, max_num_seqs, block_size). Other GPUs (the A100 included: vLLM excludes it from the
# larger defaults) take the Settings' defaults: 2048, 256, 16. (vLLM's offline `LLM` class gets larger ones.)
DEVICE_DEFAULTS = {"h100": (8192, 1024, 16), "h200": (8192, 1024, 16), "cpu": (2048, 128, 128),
                   # GPUs of >= 160 GiB (get_batch_defaults)
                   "b200": (16384, 1024, 16), "mi300x": (16384, 1024, 16), "mi325x": (16384, 1024, 16)}
DEVICE_SETTINGS = ("max_num_batched_tokens", "max_batch_size", "block_size")


class VLLMV1(Policy):
    name = "vllm-v1"
    summary = ("vLLM v1 (0.32): one token budget, running requests first then waiting FCFS, chunked prefill, "
               "paged KV with prefix caching, preempt the last by recompute; vLLM's defaults for the --gpu "
               "(listed: an A100's; cpu and h100/h200 differ)")

    @dataclass(frozen=True)
    class Settings(Settings):
        # defaults: vLLM's on a GPU; `build` takes the device's (DEVICE_DEFAULTS) for those not given
        max_batch_size: int = option(256, "most requests running at once (max_num_seqs; 1024 on --gpu "
                                          "h100/h200, 128 on cpu, as `vllm serve`)")
        max_num_batched_tokens: int = option(2048, "tokens per step, decodes and prefill chunks together "
                                                   "(8192 on --gpu h100/h200, as `vllm serve`)")
        block_size: int = option(16, "tokens per KV block (128 on --gpu cpu, as vLLM)")
        enable_prefix_caching: int = option(1, "1: automatic prefix caching, 0: off", minimum=0, maximum=1)
        long_prefill_token_threshold: int = option(0, "most tokens one request computes in a step while "
                                                      "others run or wait (0: no limit)", minimum=0)

    def __init__(self, kv: PrefixCachingKV, **options: int) -> None:
        super().__init__(kv, **options)
        s = self.settings
        if s.max_num_batched_tokens < s.max_batch_size:  # vllm/config/scheduler.py refuses it too
            raise InputError(f"--max-num-batched-tokens ({s.max_num_batched_tokens}) must be at least "
                             f"max_num_seqs, --max-batch-size ({s.max_batch_size})")
        self.kv: PrefixCachingKV = kv
        self.budget = s.max_num_batched_tokens
        self.threshold = s.long_prefill_token_threshold
        # prefix-cache lookups at admission, in tokens, as vLLM's PrefixCacheStats counts them: fresh requests
        # (its hit rate) apart from preempted ones coming back
        self.queries = self.hits = self.preempted_queries = self.preempted_hits = 0
        self.passed_over = False  # whether the last step's pass stopped with running requests left after it

    @classmethod
    def build(cls, kv_capacity_tokens: int, max_seq_len: int, options: Mapping[str, Any],
              gpu: str | None = None) -> Policy:
        settings = cls.settings_for(options, gpu)
        kv = PrefixCachingKV(kv_capacity_tokens, settings.block_size, bool(settings.enable_prefix_caching))
        return cls(kv, **settings.as_dict())

    @classmethod
    def memory_profile(cls, options: Mapping[str, Any], gpu: str) -> tuple[int, int] | None:
        # vLLM profiles a forward of max_num_batched_tokens (gpu_model_runner.py: profile_run)
        s = cls.settings_for(options, gpu)
        return s.max_num_batched_tokens, s.block_size

    @classmethod
    def settings_for(cls, options: Mapping[str, Any], gpu: str | None) -> Settings:
        """The settings given, the device's defaults (DEVICE_DEFAULTS) for the others, checked."""
        given = {k: v for k, v in options.items() if v is not None}
        device = dict(zip(DEVICE_SETTINGS, DEVICE_DEFAULTS.get(gpu or "", ())))
        settings = cls.Settings(**{**device, **given})
        settings.validate()  # before the KV manager divides by the block size
        return settings

    @classmethod
    def max_admissible_tokens(cls, kv_capacity_tokens: int, max_seq_len: int,
                              options: Mapping[str, Any] | None = None) -> int:
        # whole blocks of the size given, else the default's; a device's (cpu) is checked in `schedule`
        block = (options or {}).get("block_size") or cls.Settings().block_size
        return kv_capacity_tokens // block * block

    @property
    def shares_prefixes(self) -> bool:
        return bool(self.settings.enable_prefix_caching)

    def stats(self) -> dict[str, int]:
        # tokens, under vLLM's names: its counters vllm:prefix_cache_queries / vllm:prefix_cache_hits
        # (v1/metrics/loggers.py) count fresh requests only, PrefixCacheStats.preempted_* the rest
        if not self.settings.enable_prefix_caching:
            return {}
        return {"prefix_cache_hits": self.hits, "prefix_cache_queries": self.queries,
                "prefix_cache_preempted_hits": self.preempted_hits,
                "prefix_cache_preempted_queries": self.preempted_queries}

    @classmethod
    def summarise_stats(cls, totals: dict[str, int]) -> dict[str, Any]:
        if not totals:
            return {}
        hits, queries = totals["prefix_cache_hits"], totals["prefix_cache_queries"]
        # vLLM's hit rate: of fresh requests' tokens (preempted ones coming back are counted apart)
        return {"prefix_cache_hit_rate": hits / queries if queries else 0.0, **totals}

    def _chunk(self, seq: Seq, budget: int, eligible: int) -> int:
        """The tokens `seq` computes this step: what it has left, within the threshold and the budget."""
        n = seq.known_tokens - seq.computed
        if 0 < self.threshold < n and eligible > 1:
            n = self.threshold
        return min(n, budget)

    def schedule(self) -> BatchPlan | None:
        kv, running = self.kv, self.running
        eligible = len(running) + len(self.waiting) + len(self.arrived_with_kv)
        budget = self.budget
        seqs: list[Seq] = []
        num_new: list[int] = []
        preempted = self.passed_over = False
        i = 0
        while i < len(running) and budget > 0:
            s = running[i]
            n = self._chunk(s, budget, eligible)
            while not kv.allocate(s, s.computed + n):
                victim = self.waiting.last_ranked(running)
                scheduled = running.index(victim) < i
                self._preempt(victim)
                preempted = True
                if victim is s:
                    break
                if scheduled:  # ranked below one running after it: its tokens this step go back
                    j = seqs.index(victim)
                    budget += num_new.pop(j)
                    del seqs[j]
                    i -= 1
            if s.phase is not Phase.RUNNING:  # it preempted itself: the pass stops there
                self.passed_over = i < len(running)  # under priority some may be left after it
                break
            seqs.append(s)
            num_new.append(n)
            budget -= n
            i += 1
        self.preempted = preempted
        if not preempted:
            for queue in (self.arrived_with_kv, self.waiting):
                while queue and budget > 0 and len(running) < self.max_batch_size:
                    s = queue.head()
                    self._check_fits_alone(s)
                    hits = kv.lookup(s)
                    if not kv.fits(s, hits):
                        break
                    if s.in_prefill:
                        self._count(s, len(hits) * kv.block_size)
                        s.computed = len(hits) * kv.block_size
                    n = self._chunk(s, budget, eligible)
                    queue.take(s)
                    self._run(s)  # its hit blocks (and the cache it arrived with)
                    allocated = kv.allocate(s, s.computed + n)
                    assert allocated, "fits() counted the blocks of its whole sequence"
                    seqs.append(s)
                    num_new.append(n)
                    budget -= n
                if queue:  # nobody behind a request that could not be admitted (FCFS or priority)
                    break
        if seqs:
            return packed(seqs, num_new)
        # under priority every running request may have been preempted or stopped behind one that preempted
        # itself: vLLM's step then schedules nothing, and its next one, at once, runs what is left or admits
        return self.schedule() if preempted else None

    def _queue_may_move(self) -> bool:
        """Also after a pass that stopped before running requests it left unscheduled: the next step runs
        them, so this step's plan does not repeat."""
        return self.passed_over or super()._queue_may_move()

    def _check_fits_alone(self, seq: Seq) -> None:
        """InputError for a request that no freeing of blocks would ever let in (it would wait forever)."""
        need = -(-seq.max_len // self.kv.block_size)
        if need > self.kv.num_blocks:
            raise InputError(f"request {seq.id} needs {need} KV blocks of {self.kv.block_size} tokens "
                             f"but the cache has {self.kv.num_blocks}; use a smaller --block-size or a "
                             "larger KV cache")

    def _count(self, seq: Seq, hit_tokens: int) -> None:
        if seq.preemptions:
            self.preempted_queries += seq.known_tokens
            self.preempted_hits += hit_tokens
        else:
            self.queries += seq.known_tokens
            self.hits += hit_tokens
