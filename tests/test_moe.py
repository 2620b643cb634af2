"""Mixture-of-experts shapes and their roofline price: the expected distinct experts by hand, published
parameter counts, and the limits (one token: the active parameters; a large batch: every expert)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import MODELS, ModelSpec
from simctl.catalogue.moe import MoE, busiest_gpu, expected_distinct_experts, routing_probabilities
from simctl.common.errors import InputError
from simctl.costs.roofline import Roofline
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq
from simctl.traces.workload import Workload


def decodes(batch: int, context: int = 100) -> object:
    seqs = []
    for i in range(batch):
        s = Seq(i, 0.0, context, 10)
        s.advance(context)
        seqs.append(s)
    return hybrid(seqs, [], [])


def test_expected_distinct_experts_uniform_by_hand() -> None:
    # E = 8, k = 2: 8 (1 - (3/4)^B)
    assert expected_distinct_experts(8, 2, 1) == 2.0
    assert expected_distinct_experts(8, 2, 2) == pytest.approx(3.5)  # 8 (1 - 9/16)
    assert expected_distinct_experts(8, 2, 3) == pytest.approx(4.625)  # 8 (1 - 27/64)
    assert expected_distinct_experts(8, 2, 0) == 0.0
    assert expected_distinct_experts(8, 2, 10_000) == pytest.approx(8.0)
    # top-1 of 2: a second token misses the first's expert half the time
    assert expected_distinct_experts(2, 1, 2) == pytest.approx(1.5)


def test_skewed_routing_by_hand() -> None:
    # E = 4, k = 1, skew 1: p proportional to 1, 1/2, 1/3, 1/4 = 12/25, 6/25, 4/25, 3/25
    p = routing_probabilities(4, 1, 1.0)
    assert p == pytest.approx(np.array([12, 6, 4, 3]) / 25)
    # two tokens: sum (1 - (1 - p)^2) = 2 - sum p^2
    assert expected_distinct_experts(4, 1, 2, 1.0) == pytest.approx(2 - (144 + 36 + 16 + 9) / 625)
    # E = 4, k = 2, skew 2: the first expert's 2 / (1 + 1/4 + 1/9 + 1/16) > 1 is capped at 1, and the other
    # token's choice is spread over 1/4, 1/9, 1/16 = 36, 16, 9 (/144)
    assert routing_probabilities(4, 2, 2.0) == pytest.approx([1.0, 36 / 61, 16 / 61, 9 / 61])
    assert routing_probabilities(8, 2, 0.0) == pytest.approx(np.full(8, 0.25))


@pytest.mark.parametrize("skew", [0.0, 0.5, 1.0, 3.0])
def test_skew_invariants(skew: float) -> None:
    p = routing_probabilities(64, 6, skew)
    assert p.sum() == pytest.approx(6) and p.max() <= 1.0 and np.all(np.diff(p) <= 1e-15)
    counts = [expected_distinct_experts(64, 6, b, skew) for b in (1, 2, 8, 64, 512)]
    assert counts[0] == pytest.approx(6) and np.all(np.diff(counts) > 0) and counts[-1] <= 64
    # more skew, fewer experts read by the same batch
    assert expected_distinct_experts(64, 6, 32, skew + 0.5) < expected_distinct_experts(64, 6, 32, skew)
    # all tokens on the same k experts in the limit
    assert expected_distinct_experts(64, 6, 32, 60.0) == pytest.approx(6, rel=1e-3)


def test_bad_skew_and_shapes() -> None:
    for bad in (-0.1, math.inf, math.nan, True, "1"):
        with pytest.raises(InputError, match="--routing-skew"):
            routing_probabilities(8, 2, bad)
    with pytest.raises(InputError, match="experts_per_token"):
        MoE(4, 5, 16)
    with pytest.raises(InputError, match="leave none"):
        ModelSpec("x", 2, 64, 4, 2, 16, 128, 256, 512, moe=MoE(4, 2, 16, dense_layers=2))


def test_published_parameter_counts() -> None:
    mixtral = MODELS["mixtral-8x7b"]  # published: 46.7B parameters, 12.9B active
    assert round(mixtral.total_params / 1e9, 1) == 46.7 and round(mixtral.active_params / 1e9, 1) == 12.9
    qwen = MODELS["qwen3-30b-a3b"]  # published: 30.5B, 3.3B active (3.35B here: the card truncates)
    assert round(qwen.total_params / 1e9, 1) == 30.5 and 3.3e9 <= qwen.active_params < 3.4e9
    tiny, moe = MODELS["tiny"], MODELS["tiny-moe"]  # tiny's MLP split into 8 experts, 2 active
    assert moe.active_params == tiny.total_params + 4 * 256 * 8  # plus the 4 routers
    assert moe.total_params == tiny.total_params + 4 * (3 * 3 * 256 * 688 + 256 * 8)
    assert moe.kv_bytes_per_token() == tiny.kv_bytes_per_token()  # the attention is tiny's


def linear_by_hand(r: Roofline, T: int, params_read: float) -> float:
    m, g = r.model, r.gpu
    c = 2 * m.active_linear_params * r.tiled(T) / (g.peak_flops * r.mfu)
    w = params_read * 2 / (g.mem_bandwidth * r.mbu)
    return math.sqrt(c * c + w * w)


@pytest.mark.parametrize("batch", [1, 2, 3, 16, 512])
def test_roofline_linear_term_by_hand(batch: int) -> None:
    m = MODELS["mixtral-8x7b"]
    r = Roofline(m, "a100-80gb", gemm_latency_s=0.0)
    always = m.linear_params - 32 * 8 * m.expert_params
    read = always + 32 * m.expert_params * 8 * (1 - 0.75 ** batch)
    assert r.breakdown(decodes(batch))["linear"] == pytest.approx(linear_by_hand(r, batch, read), rel=1e-12)


def test_one_token_prices_as_the_active_parameters_and_many_as_all() -> None:
    m = MODELS["mixtral-8x7b"]
    r = Roofline(m, "h100", gemm_latency_s=0.0)
    # B = 1: two experts read, exactly a dense model of the active parameters (router included)
    assert r.breakdown(decodes(1))["linear"] == pytest.approx(linear_by_hand(r, 1, m.active_linear_params),
                                                             rel=1e-12)
    # B = 128: every expert read (8 (1 - 0.75^128) = 8 - 1e-15)
    assert r.breakdown(decodes(128))["linear"] == pytest.approx(linear_by_hand(r, 128, m.linear_params),
                                                               rel=1e-12)
    # skewed routing reads fewer experts: cheaper than uniform, dearer than the active parameters
    skewed = Roofline(m, "h100", gemm_latency_s=0.0, routing_skew=2.0)
    t = [x.breakdown(decodes(8))["linear"] for x in (r, skewed)]
    assert linear_by_hand(r, 8, m.active_linear_params) < t[1] < t[0]


def test_routing_skew_reaches_the_run_and_is_refused_where_meaningless() -> None:
    from simctl.sim.run import RunConfig, run

    base = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=2.0, num_requests=60),
                     model="qwen3-30b-a3b", gpu="h100")
    uniform, skewed = run(base).summary, run(RunConfig(**{**base.__dict__, "routing_skew": 2.0})).summary
    assert "routing_skew" not in uniform and uniform["cost_assumptions"]["routing_skew"] == 0.0
    assert skewed["routing_skew"] == 2.0 and skewed["cost_assumptions"]["routing_skew"] == 2.0
    assert skewed["tbt_p50"] < uniform["tbt_p50"]  # fewer experts read per decode step
    with pytest.raises(InputError, match="mistral-7b is dense"):
        run(RunConfig(**{**base.__dict__, "model": "mistral-7b", "routing_skew": 1.0}))
    with pytest.raises(InputError, match="prices the routing its profiled router did"):
        run(RunConfig(**{**base.__dict__, "model": "tiny-moe", "gpu": "cpu", "routing_skew": 1.0}))


def test_profile_grid_spans_the_expert_union() -> None:
    from simctl.profiler.workloads import build_grid, expert_union_tokens

    moe = MODELS["tiny-moe"].moe  # 8 (1 - 0.75^T) >= 7.9 first at T = 16
    assert expert_union_tokens(moe) == list(range(1, 17))
    assert expert_union_tokens(MODELS["qwen3-30b-a3b"].moe) == list(range(1, 17))  # capped at 16
    for name in ("full", "quick"):
        grid = build_grid(name, 2048, moe=moe)
        prompts = {s.segs[0].q for s in grid.shapes if s.kind == "prefill" and len(s.segs) == 1
                   and not s.segs[0].c}
        batches = {s.slots for s in grid.shapes if s.kind == "decode" and s.segs[0].c == 128}
        assert set(range(1, 17)) <= prompts and set(range(1, 17)) <= batches
        dense = build_grid(name, 2048)
        assert {s.label() for s in dense.shapes} < {s.label() for s in grid.shapes}


def test_vllm_profile_grid_spans_the_expert_union() -> None:
    from simctl.profiler.vllm_grid import vllm_grid

    moe = MODELS["tiny-moe"].moe
    for name in ("full", "quick"):
        grid, dense = vllm_grid(name, moe), vllm_grid(name)
        assert set(dense.probes) < set(grid.probes) and len(set(grid.probes)) == len(grid.probes)
        prompts = {p.chunk for p in grid.probes if p.kind == "prefill" and not p.cached}
        batches = {p.decodes for p in grid.probes if p.kind == "decode" and p.context == 256}
        assert set(range(1, 17)) <= prompts and set(range(1, 17)) <= batches
    assert vllm_grid("test", moe) == vllm_grid("test")


def test_a_profile_records_the_moe_shape_and_a_fit_checks_it() -> None:
    from dataclasses import asdict, replace

    from simctl.catalogue.recorded_model import model_spec_from_shape
    from simctl.costs.fitted import Fitted

    spec = MODELS["tiny-moe"]
    assert model_spec_from_shape("tiny-moe", asdict(spec)) == spec  # meta.json's model_shape, read back
    with pytest.raises(InputError, match="model_shape"):
        model_spec_from_shape("tiny-moe", {**asdict(spec), "moe": {"experts": 8}})
    fit = Fitted({k: 0.0 for k in ("overhead_s", "attn_unit_s", "attn_kv_token_s", "attn_segment_s",
                                   "decode_pad_token_s", "decode_row_s")}, 1,
                 {"linear": [[1, 0.0]], "lm_head": [[0, 0.0]], "decode_kv": [[1, 0.0]]},
                 model="tiny-moe", model_shape=asdict(spec), dtype_bytes=4)
    assert fit.weight_bytes == spec.total_params * 4  # every expert resident
    fit.check_model(spec)
    with pytest.raises(InputError, match="moe"):
        fit.check_model(replace(spec, moe=replace(spec.moe, experts_per_token=1)))


def top1_model() -> ModelSpec:
    # 8 experts, top-1: every routing of one token is one pick, so the busiest GPU's work is exact by hand
    return ModelSpec("top1", 2, 512, 8, 8, 64, 1024, 4096, 4096, moe=MoE(8, 1, 1024))


def test_expert_parallel_one_token_by_hand() -> None:
    m = top1_model()
    b = busiest_gpu(8, 1, 1, 8)
    assert (b.passes, b.experts) == (1.0, 1.0)  # one token, one expert, on one GPU of eight
    tp = Roofline(m, "h100", tp=8, gemm_latency_s=0.0)
    ep = Roofline(m, "h100", tp=8, ep=8, gemm_latency_s=0.0)
    g, r = get_gpu("h100"), tp
    expert = 2 * 3 * 512 * 1024  # both layers' experts: SwiGLU gate, up and down
    always = r.linear_params_per_gpu - 8 * expert / 8  # attention and routers, this GPU's share
    # TP: one token computes 1/8 of its expert on every GPU and reads 1/8 of it; EP: the busiest GPU holds
    # that whole expert
    c_tp = 2 * (always + expert / 8) / (g.peak_flops * r.mfu)
    m_tp = (always + expert / 8) * 2 / (g.mem_bandwidth * r.mbu)
    c_ep = 2 * always / (g.peak_flops * r.mfu) + 2 * expert / (g.peak_flops * r.mfu)
    m_ep = always * 2 / (g.mem_bandwidth * r.mbu) + expert * 2 / (g.mem_bandwidth * r.mbu)
    assert tp.breakdown(decodes(1))["linear"] == pytest.approx(math.hypot(c_tp, m_tp), rel=1e-12)
    assert ep.breakdown(decodes(1))["linear"] == pytest.approx(math.hypot(c_ep, m_ep), rel=1e-12)
    assert ep.breakdown(decodes(1))["allreduce"] == tp.breakdown(decodes(1))["allreduce"]


@pytest.mark.parametrize("experts,k,ep", [(8, 2, 2), (8, 2, 8), (128, 8, 8), (64, 6, 4)])
def test_busiest_gpu_does_the_tp_share_and_more(experts: int, k: int, ep: int) -> None:
    for tokens in (1, 4, 32, 256, 4096):
        b = busiest_gpu(experts, k, tokens, ep)
        assert b == busiest_gpu(experts, k, tokens, ep)  # seeded: same inputs, same price
        assert tokens * k / ep <= b.passes <= tokens * k
        assert expected_distinct_experts(experts, k, tokens) / ep * 0.95 <= b.experts <= experts / ep
    # a large batch balances: within a few percent of the mean, every GPU's experts read
    big = busiest_gpu(experts, k, 8192, ep)
    assert big.passes == pytest.approx(8192 * k / ep, rel=0.05) and big.experts == experts / ep


def test_expert_parallelism_costs_small_batches_and_converges_on_large() -> None:
    m = MODELS["mixtral-8x7b"]
    tp, ep = (Roofline(m, "h100", tp=2, ep=e) for e in (1, 2))
    lin = [[r.breakdown(decodes(b))["linear"] for r in (tp, ep)] for b in (1, 1024)]
    assert lin[0][1] > 1.2 * lin[0][0]  # one token: its two experts often on one GPU, read whole
    assert lin[1][1] == pytest.approx(lin[1][0], rel=0.03)  # every GPU busy with every expert it holds
    skewed = Roofline(m, "h100", tp=2, ep=2, routing_skew=1.5)
    assert skewed.breakdown(decodes(1024))["linear"] > lin[1][1]  # the popular experts' GPU waits longest


def test_expert_parallelism_refused_where_meaningless() -> None:
    with pytest.raises(InputError, match="is dense"):
        Roofline("llama-2-7b", "h100", tp=2, ep=2)
    with pytest.raises(InputError, match="must equal --tp 4"):
        Roofline("mixtral-8x7b", "h100", tp=4, ep=2)
    with pytest.raises(InputError, match="must divide"):
        Roofline(ModelSpec("six", 2, 512, 8, 8, 64, 1024, 4096, 4096, moe=MoE(6, 2, 512)), "h100", tp=4, ep=4)
    for bad in (0, -1, 1.5, True):
        with pytest.raises(InputError, match="--ep must be a positive integer"):
            Roofline("mixtral-8x7b", "h100", tp=2, ep=bad)


def test_expert_parallelism_reaches_the_run_and_is_refused_with_a_fit() -> None:
    from simctl.sim.run import RunConfig, run

    base = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=2.0, num_requests=60),
                     model="qwen3-30b-a3b", gpu="h100", tp=2)
    tp, ep = run(base).summary, run(RunConfig(**{**base.__dict__, "ep": 2})).summary
    assert "ep" not in tp and tp["cost_assumptions"]["ep"] == 1
    assert ep["ep"] == 2 and ep["cost_assumptions"]["ep"] == 2
    assert ep["tbt_p50"] > tp["tbt_p50"]  # small decode batches wait for their busiest GPU
    with pytest.raises(InputError, match="--ep 2 spreads experts over GPUs in the roofline; the fit .* "
                                         "prices what it profiled"):
        run(RunConfig(**{**base.__dict__, "model": "tiny-moe", "gpu": "cpu", "tp": 1, "ep": 2}))
