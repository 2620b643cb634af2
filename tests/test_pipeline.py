"""Pipeline parallelism (`--pp`): the stages' timing by hand (SARATHI's bubbles: unequal micro-batches leave a
later stage idle), the stage split of a step's price and of the GPUs' memory, the virtual engines through the
one replica loop, and invariants of whole runs at pp 2 and 4."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import simpy
from conftest import AffineCost, simctl_here
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.costs.fitted import Fitted
from simctl.costs.gpu_share import gpu_share
from simctl.costs.kv_capacity import (
    DEFAULT_ACTIVATION_RESERVE_BYTES,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    ReplicaMemory,
    kv_capacity_tokens,
)
from simctl.costs.pipeline import TRANSFER_LATENCY_S, pipeline_kv_tokens, stage_layers, staged
from simctl.costs.roofline import Roofline
from simctl.policies.plan import BatchPlan, hybrid
from simctl.policies.registry import make_policy
from simctl.policies.seq import Seq
from simctl.serving.cluster_config import ClusterConfig
from simctl.serving.pipeline import Pipeline
from simctl.sim.cluster import Cluster
from simctl.sim.cluster_run import make_pool, stage_backends
from simctl.sim.run import RunConfig, run
from simctl.traces.request import Request
from simctl.traces.workload import Workload


# ---- the flow shop, by hand --------------------------------------------------------------------------------
def test_two_equal_micro_batches_on_two_stages_take_three_stage_times() -> None:
    p = Pipeline(2)
    assert p.submit(0.0, 0.0, [1.0, 1.0], 0.0) == 2.0
    assert p.submit(0.0, 0.0, [1.0, 1.0], 0.0) == 3.0  # stage 0 of the second overlaps stage 1 of the first
    assert p.bubble_s == [0.0, 1.0]  # stage 1 waits once: the pipeline's fill
    assert p.busy_s == [2.0, 2.0]


def test_unequal_micro_batches_leave_a_bubble_that_uniform_ones_do_not() -> None:
    # the same work (6 stage-seconds) as a short then a long micro-batch, or as two equal ones
    unequal, uniform = Pipeline(2), Pipeline(2)
    ends = [unequal.submit(0.0, 0.0, [1.0, 1.0], 0.0), unequal.submit(0.0, 0.0, [2.0, 2.0], 0.0)]
    assert ends == [2.0, 5.0]  # stage 1 idles from 2 to 3 while the long one is still in stage 0
    assert unequal.bubble_s == [0.0, 2.0]  # the fill (1) and the imbalance (1)
    ends = [uniform.submit(0.0, 0.0, [1.5, 1.5], 0.0), uniform.submit(0.0, 0.0, [1.5, 1.5], 0.0)]
    assert ends == [3.0, 4.5]
    assert uniform.bubble_s == [0.0, 1.5]


def test_each_micro_batch_reports_the_bubbles_it_left() -> None:
    p = Pipeline(3)
    p.submit(0.0, 0.0, [1.0, 1.0, 1.0], 0.0)
    assert p.last_bubble_s == 3.0  # the fill: stage 1 idle 0-1, stage 2 idle 0-2
    p.submit(0.0, 0.0, [2.0, 2.0, 2.0], 0.0)
    # it leaves stage 0 at 3: stage 1 (free at 2) waits until 3, stage 2 (free at 3) until 5
    assert p.last_bubble_s == 3.0
    assert sum(p.bubble_s) == 6.0


def test_host_and_boundary_are_paid_in_line_and_the_host_is_shared() -> None:
    p = Pipeline(3)
    # host 0.5, stages 1, 2, 1, each boundary 0.25: 0.5 + 1 + 0.25 + 2 + 0.25 + 1
    assert p.submit(0.0, 0.5, [1.0, 2.0, 1.0], 0.25) == 5.0
    # the next waits for the host (free at 0.5), then stage 0 (free at 1.5), then stage 1 (free at 3.75)
    assert p.submit(0.0, 0.5, [1.0, 2.0, 1.0], 0.25) == pytest.approx(3.75 + 2.0 + 0.25 + 1.0)


def test_a_micro_batch_after_an_idle_pipeline_starts_when_it_is_ready() -> None:
    p = Pipeline(2)
    p.submit(0.0, 0.0, [1.0, 1.0], 0.0)
    assert p.submit(10.0, 0.0, [1.0, 1.0], 0.0) == 12.0
    assert p.bubble_s == [0.0, 2.0]  # each fill counts once: stage 1 idle while the micro-batch is in stage 0


# ---- the stage split of a step's price and of memory -------------------------------------------------------
@pytest.mark.parametrize(("layers", "pp", "split"), [(80, 2, [40, 40]), (61, 2, [31, 30]),
                                                      (10, 4, [2, 3, 3, 2]), (7, 3, [2, 3, 2]), (5, 1, [5])])
def test_layers_split_as_vllm_splits_them(layers: int, pp: int, split: list[int]) -> None:
    # vllm/distributed/utils.py: get_pp_indices: the remainder to the stages before the last, from the
    # second-to-last backwards
    assert stage_layers(layers, pp) == split


def _seq(i: int, computed: int, prompt: int = 2048) -> Seq:
    s = Seq.of(Request(i, 0.0, prompt, 100))
    s.computed = computed
    return s


def _plans() -> list[BatchPlan]:
    decodes = [_seq(i, 2049 + 100 * i) for i in range(8)]
    return [hybrid(decodes, [], []), hybrid(decodes, [_seq(9, 512)], [512]), hybrid([], [_seq(10, 0)], [256])]


@pytest.mark.parametrize("pp", [2, 3, 4])
def test_stage_times_sum_to_the_step_and_split_by_layers(pp: int) -> None:
    model = get_model("llama-2-13b")
    cost = Roofline(model, "a100-80gb")
    split = staged(cost, model, 300e9, pp)
    for plan in _plans():
        host, times = split.stage_times(plan)
        assert host + sum(times) == pytest.approx(cost.iteration_time(plan), rel=1e-12)
        terms = cost.breakdown(plan)
        assert host == terms["overhead"]
        per_layer = (times[0]) / split.layers[0]  # the first stage holds layers only
        assert times[-1] == pytest.approx(per_layer * split.layers[-1] + terms["lm_head"], rel=1e-12)


def test_a_fitted_cost_splits_its_own_terms() -> None:
    from simctl.catalogue.gpus import get_gpu
    from simctl.costs.loader import default_cost_path

    fitted = Fitted.load(default_cost_path(get_gpu("cpu")))
    model = get_model(fitted.model)
    split = staged(fitted, model, 1e9, 2)
    plan = hybrid([_seq(0, 100, 64)], [_seq(1, 0, 64)], [32])
    host, times = split.stage_times(plan)
    assert host + sum(times) == pytest.approx(fitted.iteration_time(plan), rel=1e-12)
    assert host == fitted.breakdown(plan)["overhead"]


def test_the_boundary_carries_hidden_states_and_residual() -> None:
    model = get_model("llama-2-13b")
    split = staged(Roofline(model, "a100-80gb"), model, 100e9 / 8, 2)  # 100 Gbit/s
    plan = hybrid([], [_seq(0, 0)], [512])
    # 2 tensors x 512 rows x 5120 x 2 bytes over 12.5 GB/s, plus the send's fixed 10 us
    assert split.boundary_time(plan) == pytest.approx(2 * 512 * 5120 * 2 / 12.5e9 + 10e-6)


def test_each_stage_holds_its_layers_kv() -> None:
    model, gpu = get_model("llama-2-13b"), get_gpu("a100-80gb")
    one = kv_capacity_tokens(model, gpu)
    assert pipeline_kv_tokens(model, gpu, 1, 1) == one
    # two stages: each GPU holds half the layers' weights and half of each token's KV, so about twice the
    # tokens plus what the freed weights hold
    two = pipeline_kv_tokens(model, gpu, 1, 2)
    usable = gpu.memory_bytes * DEFAULT_GPU_MEMORY_UTILIZATION - DEFAULT_ACTIVATION_RESERVE_BYTES
    half_kv = ReplicaMemory.of(model, 1, 2).kv_bytes_per_token / 2
    linears = gpu_share(model, 1).linear_params * 2
    stage0 = usable - linears / 2 - model.embedding_params * 2
    stage1 = usable - linears / 2 - model.lm_head_params * 2
    assert two == int(min(stage0, stage1) // half_kv)
    assert two > 2 * one


def test_falcon_180b_needs_its_eight_gpus() -> None:
    from simctl.common.errors import DoesNotFit

    model, gpu = get_model("falcon-180b"), get_gpu("a100-80gb")
    with pytest.raises(DoesNotFit):
        kv_capacity_tokens(model, gpu, 4)  # 360 GB of weights on four 80 GB GPUs
    assert pipeline_kv_tokens(model, gpu, 4, 2) > 100_000


# ---- virtual engines through the one replica loop ------------------------------------------------------
class Flat(AffineCost):
    """Every step takes 1 s, all of it per layer (no breakdown: split by layers alone)."""

    def __init__(self) -> None:
        super().__init__(overhead=1.0, per_token=0.0, per_attn=0.0, per_kv=0.0)


def _serve(requests: list[Request], pp: int, policy: str = "orca") -> list[Seq]:
    model = get_model("llama-2-7b")  # 32 layers: equal stages at pp 2 and 4
    cluster = Cluster(simpy.Environment())
    split = staged(Flat(), model, 1e30, pp)
    cluster.entry = make_pool("replicas", 1, "", stage_backends(Flat(), split),
                              lambda: make_policy(policy, 4096, 4096), "round-robin", cluster, None, pp=pp)
    return cluster.run(requests)


def test_two_prefills_on_two_virtual_engines_take_three_stage_times() -> None:
    # one prompt each (one output token): engine 0 and 1 each run one micro-batch of 1 s, 0.5 s a stage
    seqs = _serve([Request(0, 0.0, 100, 1), Request(1, 0.0, 100, 1)], 2)
    b = TRANSFER_LATENCY_S  # the boundary's fixed time (the link is infinitely fast)
    assert [s.completion_s for s in seqs] == [pytest.approx(1.0 + b), pytest.approx(1.5 + b)]


def test_a_request_is_not_scheduled_again_while_its_micro_batch_is_in_flight() -> None:
    # one request of 4 tokens on 4 stages: each step waits for the one before to leave the last stage, so its
    # 4 iterations take 4 x 1 s although the other stages sit idle
    b = 3 * TRANSFER_LATENCY_S  # three boundaries a micro-batch
    seqs = _serve([Request(0, 0.0, 100, 4)], 4)
    assert seqs[0].completion_s == pytest.approx(4 * (1.0 + b))
    # four requests, one per virtual engine, keep the four stages busy: 4 micro-batches in flight, the last
    # one entering 3 stage times after the first
    seqs = _serve([Request(i, 0.0, 100, 4) for i in range(4)], 4)
    assert max(s.completion_s for s in seqs) == pytest.approx(4 * (1.0 + b) + 3 * 0.25)


# ---- whole runs --------------------------------------------------------------------------------------------
def _run(policy: str, pp: int = 1, seed: int = 0, qps: float = 1.0, n: int = 24, **kw: object) -> object:
    kw = {"pp": pp, **kw}
    config = RunConfig(policy=policy, workload=Workload(trace="sharegpt", qps=qps, num_requests=n, seed=seed,
                                                       scale=0.1),
                       model="llama-2-13b", gpu="a100-80gb", **kw)
    return run(config)


@settings(max_examples=12, deadline=None)
@given(policy=st.sampled_from(["sarathi", "vllm", "orca", "vllm-v1", "faster-transformer"]),
       pp=st.sampled_from([2, 4]), seed=st.integers(0, 10_000), qps=st.sampled_from([1.0, 8.0, 64.0]))
def test_every_request_finishes_once_with_its_tokens_within_kv(policy: str, pp: int, seed: int,
                                                               qps: float) -> None:
    r = _run(policy, pp, seed, qps)
    members = r.cluster.entry.members
    assert len(members) == pp
    ids = [s.id for m in members for s in m.seqs]
    assert sorted(ids) == list(range(len(ids))) and len(ids) == r.summary["num_requests"]
    for m in members:
        for s in m.seqs:
            assert s.generated == s.output_tokens and s.completion_s >= s.first_token_s >= s.arrival_s
        assert m.policy.kv.used == 0
        peak = max(m.replica.records.iterations.kv_used, default=0)
        assert peak <= m.policy.kv.capacity
    again = _run(policy, pp, seed, qps)
    assert again.summary["e2e_p50"] == r.summary["e2e_p50"]
    assert again.summary["pipeline"] == r.summary["pipeline"]


def test_two_stages_outserve_one_gpu_on_decodes() -> None:
    # decode-heavy (short prompts, long answers), all sent at once: two stages hold two micro-batches in
    # flight on twice the GPUs, so more tokens per second, and at most twice as many
    kw = {"policy": "sarathi", "workload": Workload(trace="sharegpt", qps=None, num_requests=64,
                                                    concurrency=64, seed=3, scale=0.2),
          "model": "llama-2-13b", "gpu": "a100-80gb"}
    one = run(RunConfig(**kw)).summary["throughput_tokens_per_s"]
    two = run(RunConfig(**kw, pp=2)).summary["throughput_tokens_per_s"]
    assert one < two <= 2 * one


def test_a_lone_request_is_in_every_micro_batch_so_its_bubbles_are_all_of_them() -> None:
    # SARATHI's bubble time per request sums the bubbles of the micro-batches the request was in
    s = run(RunConfig(policy="sarathi", workload=Workload(trace="sharegpt", qps=1.0, num_requests=1, seed=2),
                      model="llama-2-13b", gpu="a100-80gb", pp=2)).summary["pipeline"]
    total = sum(s["bubble_s"])
    assert total > 0 and s["request_bubble_p50_s"] == pytest.approx(total, rel=2e-3)  # the bin's resolution
    assert s["request_bubble_p90_s"] == s["request_bubble_p50_s"]


def test_pp_one_is_the_run_without_it() -> None:
    a, b = _run("sarathi", 1, 5, 4.0), _run("sarathi", 1, 5, 4.0)
    assert "pipeline" not in a.summary and "pp" not in a.summary
    assert a.summary["e2e_p50"] == b.summary["e2e_p50"]


@pytest.mark.parametrize(("kw", "words"), [
    ({"pp": 0}, "--pp must be an integer"),
    ({"pp": 2, "pp_link_gbps": -1.0}, "--pp-link-gbps"),
])
def test_bad_pipeline_settings_are_named(kw: dict, words: str) -> None:
    with pytest.raises(InputError, match=words):
        _run("sarathi", seed=0, qps=1.0, **kw)


@pytest.mark.parametrize(("cluster", "words"), [
    (ClusterConfig(router="prefix"), "routers"),
    (ClusterConfig(prefill_instances=1, decode_instances=1, kv_link_gbps=100.0), "colocated"),
])
def test_what_pipelines_are_not_built_with_is_refused(cluster: ClusterConfig, words: str) -> None:
    config = RunConfig(workload=Workload(trace="sharegpt", qps=1.0, num_requests=8), model="llama-2-13b",
                       pp=2)
    with pytest.raises(InputError, match=words):
        run(config, cluster)


@pytest.mark.parametrize(("args", "words"), [
    (("--pp", "0"), "--pp must be an integer"),
    (("--pp", "99"), "--pp must be an integer"),
    (("--model", "tiny-2l", "--gpu", "cpu", "--pp", "3"), "has only 2 layers"),
    (("--pp", "2", "--router", "prefix", "--replicas", "2"), "routers"),
])
def test_the_command_line_refuses_a_bad_pipeline_in_one_line(args: tuple[str, ...], words: str) -> None:
    r = simctl_here("run", "--trace", "sharegpt", "--num-requests", "8", "--model", "llama-2-13b", *args)
    assert r.returncode == 2 and words in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_command_line_runs_stages_and_plan_counts_their_gpus() -> None:
    r = simctl_here("run", "--trace", "sharegpt", "--num-requests", "16", "--qps", "2", "--model",
                    "llama-2-13b", "--tp", "2", "--pp", "2", "--json")
    assert r.returncode == 0, r.stderr
    summary = json.loads(r.stdout)
    assert summary["pp"] == 2 and summary["gpus"] == 4 and summary["pipeline"]["stages"] == 2
    from simctl.studies.plan import Candidate

    assert Candidate(RunConfig(tp=4, pp=2), "x").gpus == 8


def test_sarathi_s_chunks_leave_fewer_bubbles_and_serve_more_than_orca(tmp_path: Path) -> None:
    # SARATHI's pipeline claim on a small version of its setting: 4 stages, 256 requests waiting at t = 0
    # with prompts of unequal lengths, the same batch size: Orca's whole prompts make unequal micro-batches
    rng = np.random.default_rng(0)
    trace = tmp_path / "offline.csv"
    trace.write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n" + "".join(
        f"{p},{d},0\n" for p, d in zip(rng.integers(256, 1793, 256), rng.integers(128, 257, 256))))
    out = {}
    for policy, options in (("orca", {}), ("sarathi", {"token_budget": 256})):
        config = RunConfig(policy=policy, workload=Workload(trace=str(trace), qps=None, num_requests=256),
                           model="llama-2-13b", gpu="a100-80gb", pp=4,
                           options={"max_batch_size": 32, **options})
        s = run(config).summary
        out[policy] = (sum(s["pipeline"]["bubble_s"]), s["total_tokens_per_s"])
    assert out["sarathi"][0] < out["orca"][0] / 1.5
    assert out["sarathi"][1] > out["orca"][1]
