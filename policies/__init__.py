"""Scheduling policies: pure decision logic shared by the simulator and the real engine."""

from policies.base import Policy
from policies.plan import BatchPlan, Layout
from policies.registry import POLICIES, make_policy
from policies.seq import Seq

__all__ = ["POLICIES", "BatchPlan", "Layout", "Policy", "Seq", "make_policy"]
