"""Scheduling policies: pure decision logic shared by the simulator and the real engine."""

from simctl.policies.base import Policy
from simctl.policies.plan import BatchPlan, Layout
from simctl.policies.registry import POLICIES, make_policy
from simctl.policies.seq import Seq

__all__ = ["POLICIES", "BatchPlan", "Layout", "Policy", "Seq", "make_policy"]
