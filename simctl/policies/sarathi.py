"""Sarathi-Serve: stall-free batching with chunked prefills (Sarathi-Serve, Algorithm 3).

Each iteration has a token budget tau. First every running decode joins the batch (lines 6-8), then the
ongoing partial prefills take chunks of what budget is left (lines 9-12), and only then are new requests
admitted, each with the largest chunk that still fits (lines 13-20). Decodes are never stalled by a prefill,
and an iteration never processes more than tau tokens (unless its decodes alone exceed it). `max_prefills` 1
is SARATHI's decode-maximal batching (Agrawal et al., 2023, Section 4.3): one prefill chunk beside the
decodes, its prompt's last chunk not topped up from the next prompt.

The two ablations of the paper's Table 4, as its artifact ran them (microsoft/sarathi-serve, branch
osdi-sarathi-serve, osdi-experiments/table-6/scheduling_ablation.sh):
- hybrid-batching-only: decodes and whole prefills share iterations: Sarathi's own scheduler with its chunk
  size set to the max model length (8,192 for sharegpt, 16,384 for arxiv), so as many whole prompts join the
  decodes as that budget holds, the last one split where it ends;
- chunked-prefills-only: prefills are chunked to the budget, but run in iterations of their own, taking turns
  with the decodes: a prefill iteration, then one of every running decode, and so on (the artifact's
  SimpleChunkingScheduler, microsoft/sarathi-serve, sarathi/core/scheduler/simple_chunking_scheduler.py:
  `whose_turn`). Decodes thus wait at most one chunk, and a prompt's chunks run back to back only while no
  decode runs.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

from simctl.policies.base import MAX_PREFILLS_HELP, Policy, option
from simctl.policies.kv import KVManager
from simctl.policies.plan import BatchPlan, hybrid
from simctl.policies.prefix_caching import CachesPrefixes, CachingSettings
from simctl.policies.seq import Seq


class SarathiServe(CachesPrefixes):
    name = "sarathi"
    summary = "stall-free batching: decodes first, then prefill chunks within a token budget"

    @dataclass(frozen=True)
    class Settings(CachingSettings):
        token_budget: int = option(512, "tokens per iteration (tau; 512 is the paper's strict-SLO setting)")
        max_prefills: int = option(0, MAX_PREFILLS_HELP, minimum=0)

    def __init__(self, kv: KVManager, **options: int) -> None:
        super().__init__(kv, **options)
        self.token_budget = self.settings.token_budget
        self.max_prefills = self.settings.max_prefills or self.max_batch_size

    def _chunk(self, s: Seq, used: int) -> int:
        """get_next_chunk_size: the largest piece of the pending prefill that fits the leftover budget."""
        return min(s.prefill_remaining, self.token_budget - used)

    def _prefill_chunks(self, used: int, ongoing: bool = True,
                        admit: bool = True) -> tuple[list[Seq], list[int]]:
        """The prefill segments of the iteration; `ongoing`: some running sequence may be mid-prefill (False
        when every running sequence is a decode, which saves the scan); `admit`: new requests may join (not in
        a step that preempted, as vLLM v1 schedules: under an order other than arrival a victim could
        otherwise be re-admitted, or passed, in the step that evicted it)."""
        seqs: list[Seq] = []
        chunks: list[int] = []
        for s in self.running if ongoing else ():  # lines 9-12: ongoing prefills
            if s.computed < s.prefill_end and len(seqs) < self.max_prefills:
                c = self._chunk(s, used)
                if c > 0:
                    seqs.append(s)
                    chunks.append(c)
                    used += c
                    self._scheduled(s, s.computed + c)
        while (admit and self.waiting and used < self.token_budget  # lines 13-20
               and len(seqs) < self.max_prefills and len(self.running) < self.max_batch_size
               and self.kv.can_admit(self.waiting.head())):
            s = self.waiting.head()
            self._hit(s)
            c = self._chunk(s, used)
            if c == 0:
                self._unhit(s)
                break
            seqs.append(s)
            chunks.append(c)
            used += c
            self._admit(s)
            self._scheduled(s, s.computed + c)
        return seqs, chunks

    def chunk_repeats(self, plan: BatchPlan) -> int:
        """A plan whose one prefill is a mid-prompt chunk repeats: the chunk took all the budget its decodes
        left (a chunk short of it is the prompt's last), so the next iteration has the same decodes (lines
        6-8), gives the same ongoing prompt, the first running sequence in prefill, the same chunk (lines
        9-12) and has no budget left to admit anyone (lines 13-20: a fresh arrival waits), up to the
        prompt's last chunk, which samples a token. Never with prefix caching on: each chunk's full blocks
        get their hash as it is scheduled (`simctl.policies.prefix_caching`)."""
        nd = plan.decode_tokens
        if len(plan.seqs) != nd + 1 or self.cache is not None:
            return 0
        # chunks j = 0, 1, ... of c tokens stay mid-prompt while (j + 1) c < the prompt's remaining tokens
        return max((plan.seqs[nd].prefill_remaining - 1) // plan.num_new[nd] - 1, 0)

    def schedule(self) -> BatchPlan | None:
        decodes = self._grow_decodes()  # lines 6-8
        seqs, chunks = self._prefill_chunks(len(decodes), len(decodes) < len(self.running),
                                            not self.preempted)
        if not decodes and not seqs:
            return None
        return hybrid(decodes, seqs, chunks)


class HybridBatchingOnly(SarathiServe):
    name = "sarathi-hybrid-only"
    summary = "Sarathi-Serve ablation: decodes and whole prompts, budget the max model length"
    Settings: ClassVar[type[CachingSettings]] = CachingSettings  # no token budget of its own

    def __init__(self, kv: KVManager, max_seq_len: int, **options: int) -> None:
        CachesPrefixes.__init__(self, kv, **options)
        self.token_budget = max_seq_len
        self.max_prefills = self.max_batch_size  # as many prompts as that budget holds

    @classmethod
    def build(cls, kv_capacity_tokens: int, max_seq_len: int, options: Mapping[str, Any],
              gpu: str | None = None) -> Policy:
        return super().build(kv_capacity_tokens, max_seq_len, {**options, "max_seq_len": max_seq_len}, gpu)


class ChunkedPrefillsOnly(SarathiServe):
    name = "sarathi-chunked-only"
    summary = "Sarathi-Serve ablation: chunked prefills in iterations of their own, taking turns with decodes"

    def __init__(self, kv: KVManager, **options: int) -> None:
        super().__init__(kv, **options)
        self.decode_turn = False  # the artifact's `whose_turn`: a prefill iteration hands the next to decodes

    def schedule(self) -> BatchPlan | None:
        if not self.decode_turn:
            plan = self._prefill_turn()
            if plan is not None:
                return plan
        self.decode_turn = False
        decodes = self._grow_decodes()
        if decodes:
            return hybrid(decodes, [], [])
        return self._prefill_turn()  # no decode to run: the artifact's empty decode turn, which costs nothing

    def _prefill_turn(self) -> BatchPlan | None:
        """The ongoing prefills take chunks of the budget; only when none is left mid-prompt are new requests
        admitted, each with the largest chunk that fits."""
        seqs, chunks = self._prefill_chunks(0, admit=False)
        if not seqs:
            seqs, chunks = self._prefill_chunks(0, ongoing=False)
        if not seqs:
            return None
        self.decode_turn = True
        return hybrid([], seqs, chunks)

    def _decodes_pending(self) -> bool:
        return bool(self.arrived_with_kv) or any(not s.in_prefill for s in self.running)

    def _prefill_pending(self) -> bool:
        """Whether a prefill turn would schedule something: a prompt mid-way, or an admissible head."""
        if any(s.in_prefill for s in self.running):
            return True
        return (bool(self.waiting) and len(self.running) < self.max_batch_size
                and self.kv.can_admit(self.waiting.head()))

    def chunk_repeats(self, plan: BatchPlan) -> int:
        """A chunk repeats only while no decode waits for its turn."""
        return 0 if self._decodes_pending() else super().chunk_repeats(plan)

    def extend(self, plan: BatchPlan, limit: int) -> int:
        """A decode-only plan repeats only while no prefill would take the next turn."""
        return 0 if plan.decode_only and self._prefill_pending() else super().extend(plan, limit)

    def repeats_allowed(self, plan: BatchPlan, limit: int) -> int:
        return 0 if plan.decode_only and self._prefill_pending() else super().repeats_allowed(plan, limit)
