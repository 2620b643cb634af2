"""The cost-model interface: how long the hardware takes to execute one iteration's `BatchPlan`."""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from typing import Any

import numpy as np

from simctl.policies.plan import BatchPlan


def tiled(n: int, tile: int) -> int:
    """Rows a GEMM over `n` rows pays for: n up to one tile (smaller row tiles or GEMV), else n rounded up
    to a multiple of the tile (tile quantization; hot paths inline this expression)."""
    return n if n <= tile else -(-n // tile) * tile


class CostModel(ABC):
    @abstractmethod
    def iteration_time(self, plan: BatchPlan) -> float:
        """Seconds to execute the plan."""

    def assumptions(self) -> dict[str, Any]:
        """What the model assumed (its kind, efficiencies, step overheads): summary.json's
        `cost_assumptions`."""
        return {"kind": type(self).__name__}

    @property
    def admission_s(self) -> float:
        """The front end's latency from a request's arrival until it can be scheduled
        (`simctl.costs.overheads.StepOverheads.admission_s`); 0 unless measured."""
        return 0.0

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        """Durations of `k` back-to-back repeats of a plan whose sequences keep their roles (a stretch:
        decodes that go on decoding, and a prompt's chunks that go on being mid-prompt chunks of the same
        size).

        Repeat j (from 0) is the same batch with every decode row holding j more KV tokens and every prefill
        segment j of its chunks further into its prompt (context + j x q). Implementations with a closed form
        override this; the generic one prices each repeat.
        """
        return np.array([
            self.iteration_time(dataclasses.replace(
                plan, decode_kv=plan.decode_kv + j * plan.decode_rows,
                prefill_c=[c + j * q for q, c in zip(plan.prefill_q, plan.prefill_c)]))
            for j in range(k)
        ])


@dataclasses.dataclass(frozen=True)
class ScaledCost(CostModel):
    """`base`'s times multiplied by `factor`: a machine measured `factor` times slower than when `base` was
    fitted (what-if analyses; `simctl validate` uses it to separate a machine's drift from model error)."""

    base: CostModel
    factor: float

    def iteration_time(self, plan: BatchPlan) -> float:
        return self.factor * self.base.iteration_time(plan)

    def assumptions(self) -> dict[str, Any]:
        return {**self.base.assumptions(), "scaled_by": self.factor}

    @property
    def admission_s(self) -> float:  # the front end runs on the same, slower, host
        return self.factor * self.base.admission_s

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        return self.factor * self.base.stretch_times(plan, k)
