"""A deployment's shape (`ClusterConfig`): one replica, replicas behind a router, or disaggregated prefill and
decode pools with the KV link between them, and the checks of its instance counts. Light to import: the
command line declares its cluster options from these fields (`simctl.config_options`)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from simctl.common.checks import is_int, is_number
from simctl.common.errors import InputError
from simctl.common.option_fields import option_field
from simctl.policies.registry import policy_class
from simctl.serving.routers import ROUTERS, RouterSettings, check_router

MAX_INSTANCES = 1024


@dataclass(frozen=True)
class ClusterConfig:
    """The deployment's replicas: their number and router, or disaggregated prefill and decode pools (their
    instances, GPUs, TP degrees and the KV link between them). Its fields are `simctl run`'s and `capacity`'s
    cluster options."""

    replicas: int = option_field(1, "Replicas of the deployment behind a router (each its own policy and "
                                 "KV).")
    router: str = option_field("round-robin", "How a request picks its replica at its arrival: " + "; ".join(
        f"{name} ({source})" for name, (_, source) in ROUTERS.items()) + ".")
    router_weights: str | None = option_field(None, (
        "prefix and prefix-approx: the prefix-cache, KV-utilisation and queue scorers' weights, as "
        "'2,1,1' [default: 2,1,1, llm-d's]."))
    router_index_tokens: int | None = option_field(None, (
        "prefix-approx: tokens its LRU index remembers per replica [default: 2000000, llm-d's 31,250 "
        "blocks of 64]."))
    router_lag: float | None = option_field(None, (
        "Seconds between the router's scrapes of the replicas' metrics: their queues and KV use as each "
        "engine's last step left them (kv-cost: its own count, snapshotted) [default: none, it sees them as "
        "they are]."))
    # both set: disaggregated prefill and decode
    prefill_instances: int | None = option_field(None, (
        "Disaggregated serving: instances that only prefill (with --decode-instances and --kv-link-gbps)."))
    decode_instances: int | None = option_field(None, (
        "Disaggregated serving: instances that only decode, admitting requests whose KV has crossed the "
        "link."))
    prefill_gpu: str | None = option_field(None, "GPU of the prefill instances [default: --gpu].")
    decode_gpu: str | None = option_field(None, "GPU of the decode instances [default: --gpu].")
    kv_link_gbps: float | None = option_field(None, (
        "Bandwidth of the link prefill instances send KV over, Gbit/s (one transfer at a time, first come "
        "first served; a request's whole KV crosses it whatever the two pools' TP degrees)."))
    prefill_tp: int | None = option_field(None, "Tensor-parallel degree of each prefill instance (its GPUs) "
                                          "[default: --tp].")
    decode_tp: int | None = option_field(None, "Tensor-parallel degree of each decode instance [default: "
                                         "--tp].")

    @property
    def disaggregated(self) -> bool:
        return self.prefill_instances is not None or self.decode_instances is not None

    @property
    def is_cluster(self) -> bool:
        """More than one replica (a sweep point's key, a rate per GPU, what records one replica only)."""
        return self.disaggregated or self.replicas != 1

    def validate(self, policy: str) -> None:
        check_instances(replicas=self.replicas, prefill_instances=self.prefill_instances,
                        decode_instances=self.decode_instances)
        check_router(self.router)
        self.router_settings()
        if not self.disaggregated:
            for name, v in (("prefill-gpu", self.prefill_gpu), ("decode-gpu", self.decode_gpu),
                            ("kv-link-gbps", self.kv_link_gbps), ("prefill-tp", self.prefill_tp),
                            ("decode-tp", self.decode_tp)):
                if v is not None:
                    raise InputError(f"--{name} needs --prefill-instances and --decode-instances")
            return
        if self.prefill_instances is None or self.decode_instances is None:
            raise InputError("disaggregated serving needs both --prefill-instances and --decode-instances")
        if self.replicas != 1:
            raise InputError("--replicas is for colocated serving; with --prefill-instances and "
                             "--decode-instances the instances are the replicas")
        if self.kv_link_gbps is None:
            raise InputError("disaggregated serving needs --kv-link-gbps "
                             "(the bandwidth of the link KV moves on)")
        gbps = self.kv_link_gbps
        if not is_number(gbps) or not (gbps > 0 and math.isfinite(gbps)):
            raise InputError(f"--kv-link-gbps must be a finite number > 0 (gigabits per second), "
                             f"got {gbps!r}")
        for name, tp in (("prefill-tp", self.prefill_tp), ("decode-tp", self.decode_tp)):
            if tp is not None and (not is_int(tp) or tp < 1):
                raise InputError(f"--{name} must be an integer >= 1, got {tp!r}")
        check_disaggregable(policy)

    def router_settings(self) -> RouterSettings:
        """The cache-aware routers' settings given (InputError naming a bad one); the defaults otherwise."""
        out = RouterSettings()
        if self.router_weights is not None:
            try:
                weights = tuple(float(w) for w in str(self.router_weights).split(","))
            except ValueError:
                weights = ()
            if len(weights) != 3 or not all(math.isfinite(w) and w >= 0 for w in weights) or not any(weights):
                raise InputError(f"--router-weights must be three numbers >= 0, not all 0 (prefix, KV, "
                                 f"queue), as '2,1,1'; got {self.router_weights!r}")
            out = replace(out, weights=weights)
        if self.router_index_tokens is not None:
            if not is_int(self.router_index_tokens) or self.router_index_tokens < 1:
                raise InputError(f"--router-index-tokens must be an integer >= 1, got "
                                 f"{self.router_index_tokens!r}")
            out = replace(out, index_tokens=self.router_index_tokens)
        lag = self.router_lag
        if lag is not None and (not is_number(lag) or not (lag >= 0 and math.isfinite(lag))):
            raise InputError(f"--router-lag must be a finite number of seconds >= 0, got {lag!r}")
        return out

    def pool_tp(self, pool: str, tp: int) -> int:
        """The TP degree of a pool ("prefill", "decode" or "replicas") of a run whose --tp is `tp`."""
        return {"prefill": self.prefill_tp, "decode": self.decode_tp}.get(pool) or tp

    def recorded(self, tp: int) -> dict[str, Any]:
        """The deployment as a summary records it: every field, the per-pool TP degrees resolved and only when
        disaggregated (colocated summaries keep the keys they had before per-pool parallelism)."""
        # the routers' settings only when given: a run without them keeps the summary it had before them
        out = {k: v for k, v in asdict(self).items()
               if k not in ("router_weights", "router_index_tokens", "router_lag") or v is not None}
        if self.disaggregated:
            return {**out, "prefill_tp": self.pool_tp("prefill", tp), "decode_tp": self.pool_tp("decode", tp)}
        return {k: v for k, v in out.items() if k not in ("prefill_tp", "decode_tp")}


def check_instances(**counts: int | None) -> None:
    """Instance counts (replicas=..., prefill_instances=...) given are integers from 1 to MAX_INSTANCES."""
    for name, v in counts.items():
        if v is not None and (not is_int(v) or not 1 <= v <= MAX_INSTANCES):
            raise InputError(f"--{name.replace('_', '-')} must be an integer from 1 to {MAX_INSTANCES}, "
                             f"got {v!r}")


def check_disaggregable(policy: str) -> None:
    if policy_class(policy).padded_batches:
        raise InputError(f"{policy} cannot serve disaggregated: its padded batches admit only requests it "
                         "prefilled itself; use an iteration-level policy (orca, vllm, sarathi)")
