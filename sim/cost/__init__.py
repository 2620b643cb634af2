"""Cost models: how long one iteration's `BatchPlan` takes on the hardware."""

from sim.cost.base import CostModel
from sim.cost.fitted import Fitted
from sim.cost.roofline import Roofline

__all__ = ["CostModel", "Fitted", "Roofline"]
