"""The policies by name. Each policy class describes itself (name, summary, settings, KV manager,
capabilities: see `simctl.policies.base`), so this is only the list."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from simctl.common.errors import InputError
from simctl.policies.base import Policy
from simctl.policies.baton import Baton, BatonPD
from simctl.policies.faster_transformer import FasterTransformer
from simctl.policies.full_batching import PD, HFPadded, LengthOrdered
from simctl.policies.orca import Orca
from simctl.policies.prepack import Prepack
from simctl.policies.sarathi import ChunkedPrefillsOnly, HybridBatchingOnly, SarathiServe
from simctl.policies.vllm import VLLM
from simctl.policies.vllm_v1 import VLLMV1

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (FasterTransformer, Orca, VLLM, VLLMV1, SarathiServe, HybridBatchingOnly, ChunkedPrefillsOnly,
                HFPadded, LengthOrdered, Prepack, PD, Baton, BatonPD)
}


def policy_class(name: str) -> type[Policy]:
    try:
        return POLICIES[name]
    except KeyError:
        raise InputError(f"unknown policy {name!r}; known policies: {', '.join(POLICIES)}") from None


def setting_names() -> dict[str, list[str]]:
    """Every setting any policy has, with the policies that take it (in registry order)."""
    out: dict[str, list[str]] = {}
    for name, cls in POLICIES.items():
        for f in cls.Settings.__dataclass_fields__:
            out.setdefault(f, []).append(name)
    return out


def check_options(name: str, options: Mapping[str, Any]) -> None:
    """InputError for an option given (not None) that policy `name` does not take, or out of range."""
    cls = policy_class(name)
    takes = setting_names()
    for k, v in options.items():
        if v is not None and k not in cls.Settings.__dataclass_fields__:
            raise InputError(f"--{k.replace('_', '-')} applies only to the policies "
                             f"{', '.join(takes.get(k, []))}; not to {name!r}")
    cls.Settings(**{k: v for k, v in options.items() if v is not None}).validate()


def make_policy(name: str, kv_capacity_tokens: int, max_seq_len: int,
                options: Mapping[str, Any] | None = None, gpu: str | None = None) -> Policy:
    """Build a policy with its KV manager on a deployment whose max model length is `max_seq_len`, on the
    catalogue device `gpu` (None: not known; the defaults of a policy whose defaults depend on it)."""
    return policy_class(name).build(kv_capacity_tokens, max_seq_len, options or {}, gpu)


def max_admissible_tokens(name: str, kv_capacity_tokens: int, max_seq_len: int,
                          options: Mapping[str, Any] | None = None) -> int:
    """The longest request (prompt + output) a policy, with the settings given, can ever run on this KV
    capacity."""
    return policy_class(name).max_admissible_tokens(kv_capacity_tokens, max_seq_len, options)
