"""Prepacking (Zhao et al., 2024, Algorithm 1): full batching whose prefill packs the prompts into the fewest
rows of the longest prompt's length (First-Fit Decreasing), with independent causal masks and restarted
positions inside a row, so each prompt gets exactly the KV and logits it gets alone. The KV is then unpacked
per prompt, right-padded to that length, and the batch decodes as `hf-padded`'s does.

A batch of n prompts in k rows computes k x L tokens instead of n x L: the paper's speedup predictors are
the batch-size reduction n/k and how far the longest prompt is from the mean."""

from __future__ import annotations

from dataclasses import dataclass

from simctl.policies.base import option
from simctl.policies.binpack import first_fit_decreasing
from simctl.policies.full_batching import HFPadded
from simctl.policies.plan import BatchPlan, binpacked_prefill
from simctl.policies.seq import Seq


class Prepack(HFPadded):
    name = "prepack"
    summary = "Prepacking: full batching with prompts bin-packed (FFD) into rows of the longest prompt"

    @dataclass(frozen=True)
    class Settings(HFPadded.Settings):
        varlen: int = option(0, "1: attention within each packed prompt (a variable-length kernel); 0: a "
                             "dense-masked block per row, as the paper ran", minimum=0, maximum=1)

    def _prefill(self, batch: list[Seq]) -> BatchPlan:
        lengths = [s.prefill_remaining for s in batch]
        return binpacked_prefill(batch, first_fit_decreasing(lengths, max(lengths)),
                                 bool(self.settings.varlen))
