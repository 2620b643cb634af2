"""Clusters (issue 10): replicas behind a router, disaggregated prefill and decode over a shared KV link.

Routing every request to one replica of two gives a lone replica's results exactly, for every
policy; hypothesis runs random small traces through 1-4 replicas under every router and through
prefill/decode splits, with KV tight enough to preempt, and checks what must always hold."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.base import CostModel
from simctl.costs.kv_capacity import kv_capacity_tokens
from simctl.costs.loader import load_cost
from simctl.policies.registry import POLICIES, make_policy
from simctl.policies.seq import Seq
from simctl.serving.cluster_config import ClusterConfig
from simctl.serving.front_end import NO_FRONT_END, FrontEnd
from simctl.serving.kv_link import KVLink, kv_transfer_bytes
from simctl.serving.records import request_frame
from simctl.serving.routers import ROUTERS, ReplicaView, Router, make_router
from simctl.sim.cluster import Cluster, Member, Pool
from simctl.sim.replica import CostBackend
from simctl.sim.run import RunConfig, run
from simctl.traces.request import Request
from simctl.traces.workload import Workload

TINY = get_model("tiny")
COST = load_cost(None, TINY, get_gpu("cpu")).cost
MAX_SEQ_LEN = 512
CACHE_ROUTERS = ("prefix", "prefix-approx", "kv-cost")  # they need vllm-v1's prefix cache
CONTINUOUS = [n for n, c in POLICIES.items() if not c.padded_batches]  # can admit a request with its KV


def deployment(policy: str, cost: CostModel, replicas: int = 1, router: str | Router = "round-robin",
               split: tuple[int, int] | None = None, kv: int = 100_000, gbps: float = 1.0,
               max_seq_len: int = MAX_SEQ_LEN, front_end: FrontEnd = NO_FRONT_END) -> Cluster:
    """The tiny model on `replicas` colocated replicas, or `split` = (prefill, decode) instances, each with
    `kv` token slots, priced by `cost`, behind `front_end` (the cluster tests' one way to build a
    deployment)."""
    cluster = Cluster(simpy.Environment(), KVLink(gbps) if split else None, TINY.kv_bytes_per_token())

    def pool(name: str, n: int, front: FrontEnd = NO_FRONT_END) -> Pool:
        members = [Member(i, make_policy(policy, kv, max_seq_len, {}), CostBackend(cost), None,
                          cluster.on_release) for i in range(n)]
        route = make_router(router, [m.policy.kv for m in members]) if isinstance(router, str) else router
        return Pool(name, members, route, front_end=front)

    cluster.entry = pool("prefill", split[0], front_end) if split else pool("replicas", replicas, front_end)
    if split:
        cluster.decode = pool("decode", split[1])
    return cluster


def serve(policy: str, reqs: list[tuple[float, int, int]], replicas: int = 1,
          router: str | Router = "round-robin", split: tuple[int, int] | None = None, kv: int = 100_000,
          gbps: float = 1.0) -> tuple[Cluster, list[Seq]]:
    """Serve (arrival, prompt, output) requests on `deployment`, on the tiny model's CPU cost."""
    cluster = deployment(policy, COST, replicas, router, split, kv, gbps)
    return cluster, cluster.run([Request(i, t, p, o) for i, (t, p, o) in enumerate(sorted(reqs))])


def check_invariants(cluster: Cluster, seqs: list[Seq]) -> None:
    for s in seqs:  # every request ran to its last token, in order
        assert s.generated == s.output_tokens, s
        assert s.arrival_s <= s.first_scheduled_s <= s.first_token_s <= s.completion_s, s
    pools = [cluster.entry] + ([cluster.decode] if cluster.decode else [])
    for pool in pools:  # each request reached one replica of a pool, at most once
        ids = [s.id for m in pool.members for s in m.seqs]
        assert len(ids) == len(set(ids))
    assert sorted(s.id for m in cluster.entry.members for s in m.seqs) == [s.id for s in seqs]
    handed_on = [s.id for s in seqs if s.output_tokens > 1] if cluster.decode else []
    if cluster.decode:  # a request's KV is in one decode instance, and only if it had tokens left to decode
        assert sorted(s.id for m in cluster.decode.members for s in m.seqs) == handed_on
    assert sum(m.released for m in cluster.members) == len(seqs) + len(handed_on)  # each finishes once
    for m in cluster.members:  # KV within capacity, and all of it back at the end
        kv = m.replica.policy.kv
        assert kv.used == 0 and m.replica.policy.idle
        used = np.frombuffer(m.replica.records.iterations.kv_used, dtype=np.int64)
        assert used.max(initial=0) <= kv.capacity


requests = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 300), st.integers(1, 40)), min_size=1,
                    max_size=25)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, policy=st.sampled_from(list(POLICIES)), replicas=st.integers(1, 4),
       router=st.sampled_from(list(ROUTERS)), kv=st.integers(520, 3000))
def test_replicas_serve_every_request_once_within_kv(reqs, policy, replicas, router, kv) -> None:
    policy = "vllm-v1" if router in CACHE_ROUTERS else policy  # they read a prefix cache
    check_invariants(*serve(policy, reqs, replicas=replicas, router=router, kv=kv))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=requests, policy=st.sampled_from(CONTINUOUS),
       split=st.tuples(st.integers(1, 3), st.integers(1, 3)), router=st.sampled_from(list(ROUTERS)),
       kv=st.integers(520, 3000), gbps=st.sampled_from([0.01, 1.0, 100.0]))
def test_disaggregated_serves_every_request_once_within_kv(reqs, policy, split, router, kv, gbps) -> None:
    policy = "vllm-v1" if router in CACHE_ROUTERS else policy
    check_invariants(*serve(policy, reqs, split=split, router=router, kv=kv, gbps=gbps))


@pytest.mark.parametrize("policy", list(POLICIES))
def test_routing_every_request_to_one_replica_is_a_lone_replica(policy: str) -> None:
    """A lone replica takes its arrivals ahead and cuts stretches where the next one is due; a routed replica
    is pushed each at its arrival, waits for pushes while idle and has its stretches cut by them. Routing
    every request to replica 0 of two gives the lone replica's results bit for bit."""
    rng = np.random.default_rng(1)
    reqs = list(zip(np.cumsum(rng.exponential(0.05, 150)).tolist(), rng.integers(1, 300, 150).tolist(),
                    rng.integers(1, 120, 150).tolist()))
    lone, lone_seqs = serve(policy, reqs, kv=4000)
    routed, routed_seqs = serve(policy, reqs, replicas=2, router=lambda views, seq: 0, kv=4000)
    assert not routed.entry.members[1].seqs
    assert request_frame(lone_seqs).equals(request_frame(routed_seqs))
    assert lone.entry.members[0].replica.records.iterations.frame().equals(
        routed.entry.members[0].replica.records.iterations.frame())


def test_decode_instances_never_prefill_and_ttft_includes_the_transfer() -> None:
    reqs = [(0.0, 200, 10), (0.0, 200, 10), (0.5, 64, 1)]
    cluster, seqs = serve("vllm", reqs, split=(2, 1), gbps=0.1)
    check_invariants(cluster, seqs)
    assert sum(cluster.decode.members[0].replica.records.iterations.prefill_tokens) == 0
    link = cluster.link
    took = kv_transfer_bytes(TINY.kv_bytes_per_token(), 200) / (0.1e9 / 8)
    ready = [m.seqs[0].completion_s for m in cluster.entry.members]
    assert ready[0] == ready[1]  # the same prompt on two idle instances: both on the link at once
    assert list(link.end) == [ready[0] + took, ready[0] + took + took]  # the second waits for the first
    assert sorted(s.first_token_s for s in seqs[:2]) == list(link.end)  # TTFT ends when the KV has arrived
    # one token: no transfer
    assert seqs[2].first_token_s == seqs[2].completion_s < 0.6 and len(link.end) == 2


def test_pools_of_their_own_tp_count_their_gpus_size_their_kv_and_send_the_whole_kv() -> None:
    """Prefill TP2 + decode TP1 (DistServe's placement): 3 GPUs; each pool's KV as the roofline sizes its TP
    group; the link carries a request's whole KV (every layer and head) whatever the degrees."""
    config = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", scale=0.1, num_requests=30,
                                                        qps=2.0), model="llama-2-13b")
    cc = ClusterConfig(prefill_instances=1, decode_instances=1, kv_link_gbps=100.0, prefill_tp=2, decode_tp=1)
    r = run(config, cc)
    model, gpu = get_model("llama-2-13b"), get_gpu("a100-80gb")
    assert r.summary["gpus"] == 3 and (r.summary["prefill_tp"], r.summary["decode_tp"]) == (2, 1)
    prefill, decode = (p.members[0].policy.kv.capacity for p in (r.cluster.entry, r.cluster.decode))
    block = 16  # PagedKV's
    assert prefill == kv_capacity_tokens(model, gpu, 2) // block * block
    assert decode == kv_capacity_tokens(model, gpu, 1) // block * block
    assert prefill > 2 * decode  # TP2 holds half the weights per GPU: more than twice the KV
    moved = r.result.requests.query("output_tokens > 1")["prompt_tokens"].sum()
    per_token = 2 * 40 * 40 * 128 * 2  # K and V x layers x KV heads x head dim x fp16 bytes
    assert r.summary["kv_link"]["bytes"] == moved * model.kv_bytes_per_token() == moved * per_token
    colocated = run(replace(config, tp=2))
    assert colocated.summary["gpus"] == 2 and "prefill_tp" not in colocated.summary


def test_link_transfer_takes_bytes_over_bandwidth_and_queues() -> None:
    link = KVLink(8.0)  # 1e9 bytes/s
    assert link.transfer(1.0, 500_000_000) == 1.5  # free link: bytes / bandwidth
    assert link.transfer(1.2, 1_000_000_000) == 2.5  # waits 0.3 s for the first
    assert link.transfer(3.0, 250_000_000) == 3.25  # free again
    assert list(link.start) == [1.0, 1.5, 3.0]


def test_round_robin_spreads_evenly() -> None:
    cluster, _ = serve("sarathi", [(0.01 * i, 50 + 37 * i % 200, 5) for i in range(31)], replicas=3)
    assert [len(m.seqs) for m in cluster.entry.members] == [11, 10, 10]
    assert all(s.id % 3 == m.index for m in cluster.entry.members for s in m.seqs)


@settings(max_examples=30, deadline=None)
@given(reqs=requests, replicas=st.integers(2, 4))
def test_least_outstanding_picks_a_replica_with_the_fewest_outstanding_at_that_instant(
        reqs, replicas) -> None:
    cluster, seqs = serve("vllm", reqs, replicas=replicas, router="least-outstanding", kv=2000)
    where = {s.id: m.index for m in cluster.entry.members for s in m.seqs}
    for i, s in enumerate(seqs):  # routed before any iteration ending at its arrival is applied
        outstanding = [0] * replicas
        for earlier in seqs[:i]:
            if earlier.completion_s >= s.arrival_s:
                outstanding[where[earlier.id]] += 1
        assert outstanding[where[s.id]] == min(outstanding), (i, outstanding, where[s.id])


def test_same_seed_same_results() -> None:
    config = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=6.0, num_requests=200, seed=3,
                                                        arrival="gamma", cv=3.0))
    for cc in (ClusterConfig(replicas=3, router="least-kv"),
               ClusterConfig(prefill_instances=2, decode_instances=1, kv_link_gbps=50.0,
                             router="shortest-queue")):
        a, b = run(config, cc), run(config, cc)
        assert a.result.requests.equals(b.result.requests) and a.replicas.equals(b.replicas)
        assert a.iterations.equals(b.iterations)


def test_queue_and_kv_routers_break_ties_by_outstanding_requests() -> None:
    """Empty queues (or equal KV) are the common case: the tie goes to the replica with fewer outstanding
    requests, not always to replica 0, and then to the lowest index."""
    views = [ReplicaView(0, 5, 100), ReplicaView(0, 2, 100), ReplicaView(0, 2, 100), ReplicaView(1, 0, 300)]
    assert make_router("shortest-queue")(views) == 1
    assert make_router("least-kv")(views) == 1
    assert make_router("least-outstanding")(views) == 3


def test_a_decode_instance_counts_requests_that_wait_with_their_kv() -> None:
    """A decode instance's queue is the requests that arrived with their KV and wait for a slot (a backlog of
    decodes behind a small batch), not only those waiting for a prefill (none ever do there)."""
    config = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=4.0, num_requests=100,
                                                        seed=1), options={"max_batch_size": 2})
    r = run(config, ClusterConfig(prefill_instances=2, decode_instances=1, kv_link_gbps=100.0))
    decode = r.replicas[r.replicas["pool"] == "decode"].iloc[0]
    assert decode["queue_max"] > 2 and decode["queue_mean"] > 0
