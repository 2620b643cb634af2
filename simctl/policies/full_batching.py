"""Hugging Face's full batching and the baselines of the Prepacking paper (Section 4.2), as request-level
policies: a batch is formed when none runs, prefilled at once, and decoded until its last request finishes
(`FasterTransformer`'s loop; finished rows stay in the batch and stream their tokens as they are sampled).

- `hf-padded` (Full Batching): every prompt is right-padded to the batch's longest, and attention runs under
  an explicit padding mask, so each row computes a dense L x L score block (what Hugging Face's SDPA path
  does once a padding mask is given: no causal kernel skips the upper triangle). With `early_return` 0, a
  finished request's response is returned with its batch's last one (`generate` returns the whole batch):
  its completion time (E2E) is the batch's end, while its tokens keep the times they were computed.
- `length-ordered` (Length-Ordered Batching): the same, but a new batch takes the shortest waiting prompts,
  so a batch holds similar lengths and little padding. The paper's oracle sorts the whole dataset first;
  online, it is the waiting queue sorted by prompt length (long prompts wait while shorter ones keep
  arriving: the reason the paper calls it impractical).
- `pd` (the Baton paper's "PD" baseline, Section 5.1): prefill and decode decoupled. A batch is admitted in
  arrival order; its prompts are prefilled apart, grouped by similar length (`prefill_batch_size` prompts per
  group, shortest first), and the batch then decodes combined, its KV end-aligned to the longest prompt, until
  its last query finishes. The paper does not give the group size; 1 (each prompt alone, no padding) is the
  default.
"""

from __future__ import annotations

from dataclasses import dataclass

from simctl.policies.base import Settings, admission_setting, option
from simctl.policies.faster_transformer import FasterTransformer
from simctl.policies.plan import BatchPlan, padded_prefill
from simctl.policies.seq import Seq


class HFPadded(FasterTransformer):
    name = "hf-padded"
    summary = ("Hugging Face full batching: padded B x L prefill under a dense padding mask, decode the "
               "batch out")

    @dataclass(frozen=True)
    class Settings(Settings):
        max_batch_size: int = option(16, "most requests in a batch")
        early_return: int = option(1, "1: a finished request's response returns at once (Baton's setting for "
                                   "its baselines); 0: when its whole batch ends, as Hugging Face's generate",
                                   minimum=0, maximum=1)

    def _prefill(self, batch: list[Seq]) -> BatchPlan:
        return padded_prefill(batch, dense=True)

    def finish(self, seq: Seq) -> None:
        batch = self.batch
        super().finish(seq)
        if not self.settings.early_return and not self.batch:  # the batch ended: every response returns now
            for s in batch:
                s.completion_s = seq.completion_s


class LengthOrdered(HFPadded):
    name = "length-ordered"
    summary = "Prepacking's oracle baseline: full batching of the shortest waiting prompts"

    @dataclass(frozen=True)
    class Settings(HFPadded.Settings):
        admission: str = admission_setting("shortest")  # the baseline: hf-padded taking the shortest prompts


class PD(HFPadded):
    name = "pd"
    summary = "Baton's PD baseline: prompts prefilled apart in similar-length groups, the batch decoded out"

    @dataclass(frozen=True)
    class Settings(HFPadded.Settings):
        max_batch_size: int = option(8, "most requests in a batch")
        prefill_batch_size: int = option(1, "prompts per prefill group (grouped by similar length)")

    def _prefill_groups(self, batch: list[Seq]) -> list[list[Seq]]:
        by_length = sorted(batch, key=lambda s: (s.prefill_remaining, s.arrival_s, s.id))
        g = self.settings.prefill_batch_size
        return [by_length[i:i + g] for i in range(0, len(by_length), g)]
