"""Cost models: how long one iteration's `BatchPlan` takes on the hardware.

The names below load on first use: `costs.graph_buckets` is imported by the executor's configuration and so by
the command line's option parsing, which must not pay for numpy through the cost models."""

from simctl.common.lazy_exports import lazy_exports

__getattr__ = lazy_exports(__name__, {"CostModel": "base", "Fitted": "fitted", "Roofline": "roofline"})

__all__ = ["CostModel", "Fitted", "Roofline"]
