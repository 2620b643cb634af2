"""Cost models: how long one iteration's `BatchPlan` takes on the hardware."""

from costs.base import CostModel
from costs.fitted import Fitted
from costs.roofline import Roofline

__all__ = ["CostModel", "Fitted", "Roofline"]
