"""Cache-aware and session routers (issue 40): hand-computed decisions of `prefix` (llm-d's precise prefix,
KV-utilisation and queue scorers), `prefix-approx` (the router's own LRU index), `load`, `session` and
`random`; invariants over random traces with shared prefixes and sessions under every router (each request
served once, each replica's cache holding only blocks of requests it served); per-replica hit counts that add
up to the run's."""

from __future__ import annotations

import math

import pytest
import simpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.costs.loader import load_cost
from simctl.policies.admission import ADMISSION_ORDERS, waiting_queue
from simctl.policies.prefix_kv import PrefixCachingKV
from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq
from simctl.serving.cluster_config import ClusterConfig
from simctl.serving.routers import ROUTERS, ReplicaView, RouterSettings, make_router
from simctl.sim.cluster import Cluster, Member, Pool
from simctl.sim.replica import CostBackend
from simctl.sim.run import RunConfig, run
from simctl.traces.request import Request
from simctl.traces.workload import Workload

TINY = get_model("tiny")
COST = load_cost(None, TINY, get_gpu("cpu")).cost


def kv_with(*prompts: int, group: int = 7) -> PrefixCachingKV:
    """A pool of 16 blocks of 4 tokens that has served (and freed) requests of `group` of these prompts."""
    kv = PrefixCachingKV(64, 4, caching=True)
    for i, p in enumerate(prompts):
        s = Seq(100 + i, 0.0, p, 1, prefix_group=group, prefix_tokens=p)
        kv.admit(s)
        assert kv.allocate(s, p)
        kv.free(s)
    return kv


def request(prompt: int, group: int = 7, id: int = 0, session: int = -1) -> Seq:
    return Seq(id, 0.0, prompt, 1, prefix_group=group, prefix_tokens=prompt, session=session)


def test_precise_prefix_scores_cached_runs_min_max_with_kv_and_queue() -> None:
    # the request has (17 - 1) // 4 = 4 blocks a hit may cover; replica 0 caches 2 of them (a 9-token
    # prompt's 2 full blocks), replica 1 caches 3, replica 2 none: prefix scores (min-max over 2..3) 0, 1, 0
    caches = [kv_with(9), kv_with(13), kv_with()]
    views = [ReplicaView(0, 3, 0), ReplicaView(2, 2, 32), ReplicaView(0, 1, 0)]
    # queue scores (2 - q) / 2: 1, 0, 1; KV scores 1 - used / 64: 1, 0.5, 1
    # 2:1:1 -> 2, 2 x 1 + 0.5 + 0 = 2.5, 2: replica 1
    assert make_router("prefix", caches)(views, request(17)) == 1
    # 1:1:1 -> 2, 1.5, 2: replicas 0 and 2 tie, 2 has fewer outstanding requests
    assert make_router("prefix", caches, RouterSettings(weights=(1, 1, 1)))(views, request(17)) == 2
    # another group is cached nowhere: every prefix score 0
    assert make_router("prefix", caches)(views, request(17, group=8)) == 2


def test_precise_prefix_scores_every_holder_1_when_they_hold_the_same_run() -> None:
    caches = [kv_with(), kv_with(13), kv_with(13)]
    views = [ReplicaView(0, 0, 0), ReplicaView(0, 0, 8), ReplicaView(0, 0, 0)]
    # prefix 0, 1, 1 (equal runs score 1); KV 1, 0.875, 1: replica 2, 2 + 1 + 1 = 4
    assert make_router("prefix", caches)(views, request(17)) == 2


def test_approximate_prefix_follows_its_own_index_not_the_caches() -> None:
    caches = [kv_with(), kv_with()]  # nothing is ever cached: the router cannot see that
    route = make_router("prefix-approx", caches)
    idle = [ReplicaView(0, 0, 0), ReplicaView(0, 0, 0)]
    assert route(idle, request(17, id=1)) == 0  # all scores equal: the first
    # replica 0 matched 2 of 2 blocks in its index: 2 x 1 + 1 + 0 = 3 beats replica 1's 0 + 1 + 1
    busy = [ReplicaView(1, 1, 0), ReplicaView(0, 0, 0)]
    assert route(busy, request(9, id=2)) == 0
    # a 2-block index (8 tokens) has kept only the last 2 of the first request's 4 blocks: no match
    small = make_router("prefix-approx", caches, RouterSettings(index_tokens=8))
    assert small(idle, request(17, id=1)) == 0
    assert small(busy, request(9, id=2)) == 1


def test_kv_cost_is_prefill_tokens_left_over_the_block_size_plus_decode_blocks() -> None:
    # the request's 4 blocks (17 tokens); replica 0 caches 2 of them, replica 1 3, replica 2 none (all free)
    caches = [kv_with(9), kv_with(13), kv_with()]
    idle = [ReplicaView(0, 0, 0, 0)] * 3
    # (prefill left + 17 - overlap x 4) / 4 + blocks held + 4 - held overlap: 9/4 + 4, 5/4 + 4, 17/4 + 4
    assert make_router("kv-cost", caches)(idle, request(17)) == 1
    # replica 1 has 8 prompt tokens to prefill and holds 4 blocks: (8 + 5)/4 + 4 + 4 = 11.25 > 6.25
    busy = [ReplicaView(0, 0, 0, 0), ReplicaView(1, 1, 16, 8), ReplicaView(0, 0, 0, 0)]
    assert make_router("kv-cost", caches)(busy, request(17)) == 0
    # a group cached nowhere: 8.25 on replicas 0 and 2 (17/4 + 4), 14.25 on replica 1: the lower index
    assert make_router("kv-cost", caches)(busy, request(17, group=8)) == 0


def test_kv_cost_counts_blocks_a_running_request_holds_once() -> None:
    # replica 0: a running request of the group holds 4 blocks, its first 3 hashed (13 tokens); replica 1
    # caches the same 3 blocks, free
    held = PrefixCachingKV(64, 4, caching=True)
    s = Seq(100, 0.0, 13, 1, prefix_group=7, prefix_tokens=13)
    held.admit(s)
    assert held.allocate(s, 13)
    assert held.cached_run_held(held.block_keys(request(17))) == (3, 3)
    views = [ReplicaView(0, 1, 16, 0), ReplicaView(0, 0, 0, 0)]
    # replica 0: 5/4 + 4 held + (4 - 3) = 6.25 (its 3 held blocks not counted again); replica 1: 5/4 + 4
    assert make_router("kv-cost", [held, kv_with(13)])(views, request(17)) == 1
    # replica 1 holding 1 block: 6.25 each, the tie to fewer outstanding; holding 2: 7.25, replica 0
    views[1] = ReplicaView(0, 0, 4, 0)
    assert make_router("kv-cost", [held, kv_with(13)])(views, request(17)) == 1
    views[1] = ReplicaView(0, 0, 8, 0)
    assert make_router("kv-cost", [held, kv_with(13)])(views, request(17)) == 0


def test_a_replica_view_counts_prefill_tokens_left_only_for_a_router_that_reads_them() -> None:
    cluster = Cluster(simpy.Environment())
    m = Member(0, make_policy("vllm-v1", 4000, 512, {"block_size": 16}), CostBackend(COST), None,
               cluster.on_release)
    waiting, running, pushed = Seq(1, 0.0, 100, 4), Seq(2, 0.0, 300, 4), Seq(3, 0.0, 50, 4)
    decoding = Seq(4, 0.0, 30, 4)
    m.policy.waiting.add(waiting)
    running.computed = 120  # 180 left
    decoding.computed = 30
    m.policy.running += [running, decoding]
    m.inbox.push_due(pushed, 0.0)
    assert m.view_with_prefill().prefill == 100 + 180 + 50
    assert m.view().prefill == 0
    for router, reads in (("kv-cost", True), ("prefix", False), ("round-robin", False)):
        pool = Pool("replicas", [m], make_router(router, [m.policy.kv]))
        assert pool._snapshot()[0].prefill == (330 if reads else 0)


def test_kv_cost_counts_a_queued_request_less_the_overlap_it_found_as_dynamo() -> None:
    # replica 0 caches 3 blocks of 4 tokens of the group (a 13-token prompt served); each request has 17
    # tokens, 4 blocks a hit may cover, so 17 - 12 = 5 tokens to prefill on replica 0 and 17 on replica 1
    cluster = Cluster(simpy.Environment())
    members = [Member(i, make_policy("vllm-v1", 64, 512, {"block_size": 4}), CostBackend(COST), None,
                      cluster.on_release) for i in range(2)]
    served = Seq(100, 0.0, 13, 1, prefix_group=7, prefix_tokens=13)
    kv = members[0].policy.kv
    kv.admit(served)
    assert kv.allocate(served, 13)
    kv.free(served)
    pool = Pool("replicas", members, make_router("kv-cost", [m.policy.kv for m in members]))
    placed = []
    for i in range(4):
        seq = request(17, id=i)
        pool.route(seq, 0.0)
        placed.append(next(m.index for m in members if seq in m.seqs))
    # cost = pending prefill / 4 + 4 new blocks. Replica 1: 17/4 + 4 = 8.25 while empty. Replica 0: its queued
    # requests count 5 each (Dynamo's prompt less overlap), so 5/4 + 4, 10/4 + 4, 15/4 + 4 (< 8.25), then
    # 20/4 + 4 = 9 (> 8.25). Counting each queued prompt whole would send the second there: 22/4 + 4 = 9.5.
    assert placed == [0, 0, 0, 1]
    assert [m.view_with_prefill().prefill for m in members] == [15, 17]
    assert [s.routed_overlap for s in members[0].seqs] == [12, 12, 12]


def walked_prefill(m: Member) -> int:
    """The prompt tokens left to prefill on `m`, walking every request queued (less the overlap kv-cost found
    when it routed it) or running there: what `Member.view_with_prefill` keeps as counts."""
    p = m.policy
    queued = [*p.waiting, *p.arrived_with_kv, *(s for _, s in m.inbox.due_by(math.inf))]
    return (sum(s.prefill_end - s.routed_overlap for s in queued if s.in_prefill)
            + sum(s.prefill_end - s.computed for s in p.running if s.in_prefill))


class CheckedKVCost:
    """kv-cost, checking at every arrival that each replica's counted pending prefill is the walked one."""

    reads_prefill = True

    def __init__(self, members: list[Member]) -> None:
        self.members = members
        self.route = make_router("kv-cost", [m.policy.kv for m in members])
        self.checked = 0

    def __call__(self, views: list[ReplicaView], seq: Seq | None = None) -> int:
        assert [v.prefill for v in views] == [walked_prefill(m) for m in self.members]
        self.checked += 1
        return self.route(views, seq)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.lists(st.tuples(st.floats(0, 1), st.integers(1, 300), st.integers(1, 40), st.integers(-1, 2)),
                     min_size=1, max_size=30),
       replicas=st.integers(2, 3), kv=st.integers(400, 1200))  # every request fits alone
def test_counted_pending_prefill_is_the_walked_one_at_every_arrival(rows, replicas, kv) -> None:
    # small pools preempt: a preempted request goes back to the queue with its prompt and outputs to prefill
    cluster = Cluster(simpy.Environment())
    members = [Member(i, make_policy("vllm-v1", kv, 512, {"block_size": 16}),
                      CostBackend(COST), None, cluster.on_release) for i in range(replicas)]
    router = CheckedKVCost(members)
    cluster.entry = Pool("replicas", members, router)
    reqs = [Request(i, t, p, o, prefix_group=g, prefix_tokens=min(p, 64) if g >= 0 else 0)
            for i, (t, p, o, g) in enumerate(sorted(rows))]
    cluster.run(reqs)
    assert router.checked == len(reqs)


@pytest.mark.parametrize("order", ADMISSION_ORDERS)
def test_a_waiting_queue_counts_the_tokens_its_requests_have_to_prefill(order: str) -> None:
    queue = waiting_queue(order)
    a, b, c = Seq(1, 0.0, 100, 4), Seq(2, 0.1, 30, 4), Seq(3, 0.2, 7, 4)
    c.computed, c.generated = 7, 1  # arrived with its KV: nothing to prefill
    for s in (a, b, c):
        queue.add(s)
    assert queue.prefill == 130
    queue.take(b)
    queue.remove(c)
    assert queue.prefill == 100
    b.generated = 5
    b.reset_for_recompute()  # preempted after 5 outputs: 35 tokens to prefill again
    queue.requeue(b)
    assert queue.prefill == 135
    queue.take(queue.head())
    queue.take(queue.head())
    assert queue.prefill == 0 and not queue


def test_load_router_is_the_kv_and_queue_scorers() -> None:
    caches = [kv_with(), kv_with(), kv_with()]
    views = [ReplicaView(4, 4, 0), ReplicaView(0, 5, 40), ReplicaView(2, 2, 16)]
    # KV 1, 0.375, 0.75; queue 0, 1, 0.5: 1, 1.375, 1.25
    assert make_router("load", caches)(views, request(17)) == 1


def test_session_sticks_until_its_replica_saturates() -> None:
    route = make_router("session")
    views = [ReplicaView(0, n, 0) for n in (3, 1, 2)]
    assert route(views, request(9, session=5)) == 1  # first turn: the least outstanding
    views = [ReplicaView(0, n, 0) for n in (0, 64, 2)]
    assert route(views, request(9, session=5)) == 1  # 64 above the least: not more than 64, it stays
    views = [ReplicaView(0, n, 0) for n in (200, 300, 250)]
    assert route(views, request(9, session=5)) == 1  # 100 above, but not over 1.5 x 200: it stays
    views = [ReplicaView(0, n, 0) for n in (10, 75, 12)]
    assert route(views, request(9, session=5)) == 0  # 65 above and over 1.5 x 10: saturated, it moves


def test_session_moves_a_saturated_session_and_keeps_it_there() -> None:
    route = make_router("session")
    assert route([ReplicaView(0, 0, 0), ReplicaView(0, 1, 0)], request(9, session=3)) == 0
    # replica 0 has 80 outstanding, replica 1 has 10: 70 > 64 and 80 > 15: saturated, the turn moves
    assert route([ReplicaView(0, 80, 0), ReplicaView(0, 10, 0)], request(9, session=3)) == 1
    assert route([ReplicaView(0, 0, 0), ReplicaView(0, 30, 0)], request(9, session=3)) == 1  # and stays
    # 100 and 40: 60 above, within 64: stays although replica 0 is far less loaded
    assert route([ReplicaView(0, 40, 0), ReplicaView(0, 100, 0)], request(9, session=3)) == 1
    # no session: the least outstanding
    assert route([ReplicaView(0, 2, 0), ReplicaView(0, 1, 0)], request(9)) == 1


def test_random_router_repeats_with_its_seed() -> None:
    views = [ReplicaView(0, 0, 0)] * 4
    a, b = make_router("random"), make_router("random")
    picks = [a(views, None) for _ in range(200)]
    assert picks == [b(views, None) for _ in range(200)]
    assert set(picks) == {0, 1, 2, 3}


def test_prefix_routers_need_a_prefix_cache() -> None:
    sarathi = [make_policy("sarathi", 1000, 512, {}).kv]
    with pytest.raises(InputError, match="prefix caching"):
        make_router("prefix", sarathi)
    off = [make_policy("vllm-v1", 1000, 512, {"enable_prefix_caching": 0}).kv]
    with pytest.raises(InputError, match="prefix caching"):
        make_router("prefix-approx", off)


@pytest.mark.parametrize("weights", ["1,2", "a,b,c", "0,0,0", "-1,1,1", "nan,1,1"])
def test_router_weights_are_three_numbers(weights: str) -> None:
    with pytest.raises(InputError, match="--router-weights"):
        ClusterConfig(replicas=2, router="prefix", router_weights=weights).validate("vllm-v1")
    assert ClusterConfig(router_weights="3,2,2").router_settings().weights == (3.0, 2.0, 2.0)


@pytest.mark.parametrize(("option", "value"), [("router_index_tokens", 0), ("router_lag", -1.0),
                                               ("router_lag", float("inf"))])
def test_router_settings_refuse_bad_values(option: str, value: float) -> None:
    with pytest.raises(InputError, match=f"--{option.replace('_', '-')}"):
        ClusterConfig(replicas=2, router="prefix", **{option: value}).validate("vllm-v1")


# --- invariants over random traces: every router, shared prefixes and sessions ---

def serve(reqs: list[Request], replicas: int, router: str, kv: int, lag: float = 0.0
          ) -> tuple[Cluster, list[Seq]]:
    cluster = Cluster(simpy.Environment())
    members = [Member(i, make_policy("vllm-v1", kv, 512, {"block_size": 16}), CostBackend(COST), None,
                      cluster.on_release) for i in range(replicas)]
    cluster.entry = Pool("replicas", members, make_router(router, [m.policy.kv for m in members]), lag=lag)
    return cluster, cluster.run(reqs)


def test_router_lag_routes_on_the_last_snapshot() -> None:
    reqs = [Request(i, t, 100, 400) for i, t in enumerate((0.0, 0.1, 0.2))]
    placed = {}
    for lag in (0.0, 10.0):
        cluster, _ = serve(reqs, 2, "least-outstanding", 4000, lag)
        placed[lag] = [[s.id for s in m.seqs] for m in cluster.entry.members]
    assert placed[0.0] == [[0, 2], [1]]  # each arrival sees the one before it
    assert placed[10.0] == [[0, 1, 2], []]  # all three see the snapshot taken at the first: all idle


def test_scraped_metrics_show_a_step_once_it_has_ended() -> None:
    """A scraping router (lag > 0) reads what each engine's last step left, as vLLM makes its stats once a
    step: request 1 goes to the idle replica 1 and its prefill step (27.5 ms) is running at 0.201 s, so the
    exact view shows replica 1 holding its 400-token prompt (more than request 0's 100 and the tokens it has
    decoded on replica 0), while the scraped one still shows it empty: request 2 follows request 1 there."""
    reqs = [Request(0, 0.0, 100, 300), Request(1, 0.2, 400, 4), Request(2, 0.201, 400, 4)]
    placed = {}
    for lag in (0.0, 1e-9):  # 1e-9: a fresh scrape at every arrival, so only the step's staleness is left
        cluster, _ = serve(reqs, 2, "least-kv", 4000, lag)
        placed[lag] = [[s.id for s in m.seqs] for m in cluster.entry.members]
    assert placed[0.0] == [[0, 2], [1]]
    assert placed[1e-9] == [[0], [1, 2]]


traces = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 200), st.integers(1, 30), st.integers(-1, 2),
                            st.integers(-1, 3)), min_size=1, max_size=25)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=traces, replicas=st.integers(1, 4), router=st.sampled_from(list(ROUTERS)),
       kv=st.integers(400, 2000), lag=st.sampled_from([0.0, 0.05, 1.0]))
def test_every_router_serves_each_request_once_and_caches_only_what_it_served(rows, replicas, router, kv,
                                                                              lag) -> None:
    reqs = [Request(i, t, p, o, prefix_group=g, prefix_tokens=min(p, 64) if g >= 0 else 0, session=s)
            for i, (t, p, o, g, s) in enumerate(sorted(rows))]
    cluster, seqs = serve(reqs, replicas, router, kv, lag)
    assert sorted(s.id for m in cluster.entry.members for s in m.seqs) == [r.id for r in reqs]
    for s in seqs:
        assert s.generated == s.output_tokens
    for m in cluster.entry.members:
        pool: PrefixCachingKV = m.policy.kv
        assert pool.used == 0
        # every block it caches is a block of a request it served (keyed by content)
        served = {k for s in m.seqs for k in pool._make_keys(s, 0, s.known_tokens // pool.block_size)}
        assert set(pool.cached) <= served
        # and its counted hits never exceed what it was asked
        stats = m.policy.stats()
        assert 0 <= stats["prefix_cache_hits"] <= stats["prefix_cache_queries"]


def test_replica_rows_carry_each_replicas_prefix_cache_hits(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    rows = ["arrived_at,num_prefill_tokens,num_decode_tokens,prefix_group,prefix_tokens"]
    rows += [f"{i * 0.05},{300},{8},{i % 3},{256}" for i in range(30)]
    trace.write_text("\n".join(rows) + "\n")
    config = RunConfig(policy="vllm-v1", workload=Workload(trace=str(trace), qps=None, num_requests=30),
                       model="tiny", gpu="cpu")
    for router in ("round-robin", "prefix"):
        r = run(config, ClusterConfig(replicas=3, router=router))
        rows_ = r.summary["replica_metrics"]
        assert sum(x["prefix_cache_hits"] for x in rows_) == r.summary["prefix_cache_hits"]
        assert all(0 <= x["prefix_cache_hit_rate"] <= 1 for x in rows_)
        assert "prefix_cache_hit_rate" in r.replicas.columns
    # the prefix router sends each group where it is cached: fewer prompt tokens computed again
    hits = {router: run(config, ClusterConfig(replicas=3, router=router)).summary["prefix_cache_hit_rate"]
            for router in ("random", "prefix")}
    assert hits["prefix"] > hits["random"]


def test_a_disaggregated_prefill_pool_routes_to_the_instance_holding_the_prefix(tmp_path) -> None:
    trace = tmp_path / "t.csv"
    # two requests of one group, far apart: the second finds the first's prefix on its prefill instance
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens,prefix_group,prefix_tokens\n"
                     "0,300,4,-1,0\n0.001,300,4,5,256\n5,300,4,5,256\n")
    config = RunConfig(policy="vllm-v1", workload=Workload(trace=str(trace), qps=None, num_requests=3),
                       model="tiny", gpu="cpu")
    cc = ClusterConfig(prefill_instances=2, decode_instances=1, kv_link_gbps=100.0, router="prefix")
    r = run(config, cc)
    where = r.result.request_columns["prefill_replica"].tolist()
    assert where[0] != where[1] and where[2] == where[1]
    assert r.summary["prefix_cache_hits"] >= 256
