"""The roofline cost model: every term against a hand calculation from the spec numbers, and its shape."""

import dataclasses
import math
from itertools import pairwise

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.catalogue.gpus import AllReduceFit, get_gpu
from simctl.common.errors import InputError
from simctl.costs import CostModel, Roofline
from simctl.policies.plan import BatchPlan, Layout, packed, padded_decode, padded_prefill
from simctl.policies.seq import Seq

# Spec numbers written out by hand (A100-80GB SXM datasheet; Mistral-7B-v0.1 config.json) and the defaults.
PEAK, BW = 312e12, 2039e9
MFU, MBU, ATTN_MFU = 0.70, 0.75, 0.50
STEP_S_PER_LAYER, REQUEST_S = 18.1e-6, 0.118e-3  # the host's cuda-graph defaults (costs/overheads.py)
L, H, HEADS, KV_HEADS, D, FF, V = 32, 4096, 32, 8, 128, 14336, 32000
P_LIN = L * (H * (HEADS + 2 * KV_HEADS) * D + HEADS * D * H + 3 * H * FF)  # 6,979,321,856
KV_TOK = 2 * L * KV_HEADS * D * 2  # 131,072 bytes


def host(plan):
    return L * STEP_S_PER_LAYER + REQUEST_S * len(plan.seqs)


def blend(c, m):
    return math.sqrt(c * c + m * m)


def hand_linear(t_eff):
    return blend(2 * P_LIN * t_eff / (PEAK * MFU), 2 * P_LIN / (BW * MBU))


def hand_lm_head(rows):
    return blend(2 * V * H * rows / (PEAK * MFU), 2 * V * H / (BW * MBU))


def hand_prefill_attn(q, c):
    return blend(4 * L * HEADS * D * q * (c + q / 2) / (PEAK * ATTN_MFU), (c + q) * KV_TOK / (BW * MBU))


def hand_decode_attn(kv):
    return kv * KV_TOK / (BW * MBU)


@pytest.fixture(scope="module")
def rf():
    # the formula by hand at the default efficiencies (the catalogue's measured A100 ones are tested apart)
    return Roofline("mistral-7b", "a100-80gb", mfu=MFU, mbu=MBU, gemm_latency_s=0.0)


def test_measured_efficiencies_and_gemm_latency_by_hand():
    rf = Roofline("mistral-7b", "a100-80gb")  # the catalogue's A100: mfu 0.757, mbu 0.819, 6.9 us per GEMM
    assert (rf.mfu, rf.mbu, rf.gemm_latency_s) == (0.757, 0.819, 6.9e-6)
    plan = decode_plan(1, 1024)
    b = rf.breakdown(plan)
    lin = blend(2 * P_LIN / (PEAK * 0.757), 2 * P_LIN / (BW * 0.819)) + 4 * L * 6.9e-6
    assert b["linear"] == pytest.approx(lin, rel=1e-9)
    assert b["lm_head"] == pytest.approx(blend(2 * V * H / (PEAK * 0.757), 2 * V * H / (BW * 0.819)) + 6.9e-6,
                                         rel=1e-9)


def decode_plan(rows, ctx):
    return BatchPlan([], [1] * rows, Layout.PACKED, rows, rows, decode_rows=rows, decode_kv=rows * ctx)


def prefill_plan(qs, cs, sampled=None):
    sampled = len(qs) if sampled is None else sampled
    return BatchPlan([], list(qs), Layout.PACKED, sum(qs), sampled, list(qs), list(cs))


def fresh(prompt, pid=0):
    return Seq(pid, 0.0, prompt, 16)


def test_decode_batch1_every_term(rf):
    plan = decode_plan(1, 1024)
    b = rf.breakdown(plan)
    assert b["overhead"] == pytest.approx(32 * 18.1e-6, rel=1e-12) == host(plan)  # no Seq: no request term
    assert b["linear"] == pytest.approx(hand_linear(1), rel=1e-9)
    assert b["lm_head"] == pytest.approx(hand_lm_head(1), rel=1e-9)
    assert b["decode_attention"] == pytest.approx(hand_decode_attn(1024), rel=1e-9)
    assert b["prefill_attention"] == 0.0 and b["allreduce"] == 0.0
    expected = host(plan) + hand_linear(1) + hand_lm_head(1) + hand_decode_attn(1024)
    assert rf.iteration_time(plan) == pytest.approx(expected, rel=1e-9)
    assert rf.iteration_time(plan) == pytest.approx(sum(b.values()), rel=1e-12)


def test_decode_batch32(rf):
    plan = decode_plan(32, 1024)
    expected = host(plan) + hand_linear(32) + hand_lm_head(32) + hand_decode_attn(32 * 1024)
    assert rf.iteration_time(plan) == pytest.approx(expected, rel=1e-9)


def test_prefill_chunk_on_cache_every_term(rf):
    # one chunk of 300 new tokens on 700 cached (mid-prompt: nothing sampled), plus 5 decodes at 2000 ctx
    plan = BatchPlan([], [300] + [1] * 5, Layout.PACKED, 305, 5, [300], [700], decode_rows=5, decode_kv=10000)
    b = rf.breakdown(plan)
    assert b["linear"] == pytest.approx(hand_linear(384), rel=1e-9)  # 305 rows -> 3 tiles of 128
    assert b["lm_head"] == pytest.approx(hand_lm_head(5), rel=1e-9)
    assert b["prefill_attention"] == pytest.approx(hand_prefill_attn(300, 700), rel=1e-9)
    assert b["decode_attention"] == pytest.approx(hand_decode_attn(10000), rel=1e-9)
    expected = (host(plan) + hand_linear(384) + hand_lm_head(5) + hand_prefill_attn(300, 700)
                + hand_decode_attn(10000))
    assert rf.iteration_time(plan) == pytest.approx(expected, rel=1e-9)


def test_several_segments_are_summed(rf):
    plan = prefill_plan([100, 200], [0, 50])
    expected = (host(plan) + hand_linear(300 + 84) + hand_lm_head(2) + hand_prefill_attn(100, 0)
                + hand_prefill_attn(200, 50))
    assert rf.iteration_time(plan) == pytest.approx(expected, rel=1e-9)


def test_tile_rule(rf):
    assert [rf.tiled(n) for n in (1, 100, 128, 129, 256, 257, 2048)] == [1, 100, 128, 256, 256, 384, 2048]
    assert rf.breakdown(prefill_plan([129], [0]))["linear"] == pytest.approx(hand_linear(256), rel=1e-9)
    assert Roofline("mistral-7b", "a100-80gb", tile=64).tiled(65) == 128


def test_tile_plus_one_costs_visibly_more(rf):
    for tile in (128, 256):
        s = fresh(4000)
        t_tile = rf.iteration_time(packed([s], [tile]))
        t_more = rf.iteration_time(packed([s], [tile + 1]))
        assert t_more > 1.10 * t_tile, (tile, t_tile, t_more)
    # Sarathi-Serve reports chunk 257 up to 32% slower than 256; the roofline gives the same order
    s = fresh(4000)
    ratio = rf.iteration_time(packed([s], [257])) / rf.iteration_time(packed([s], [256]))
    assert 1.2 < ratio < 1.5


def test_monotone_in_tokens_and_context(rf):
    times = [rf.iteration_time(prefill_plan([q], [0])) for q in range(1, 4097, 7)]
    assert all(b >= a for a, b in pairwise(times))
    times = [rf.iteration_time(prefill_plan([256], [c])) for c in range(0, 16384, 512)]
    assert all(b > a for a, b in pairwise(times))
    times = [rf.iteration_time(decode_plan(16, c)) for c in range(1, 8192, 100)]
    assert all(b > a for a, b in pairwise(times))
    times = [rf.iteration_time(decode_plan(b, 1024)) for b in range(1, 256)]
    assert all(b > a for a, b in pairwise(times))


def test_padded_costs_more_than_packed(rf):
    prompts = [100, 500, 1000]
    seqs = [fresh(p, i) for i, p in enumerate(prompts)]
    t_packed = rf.iteration_time(packed(seqs, prompts))
    t_padded = rf.iteration_time(padded_prefill(seqs))
    assert t_padded > t_packed
    # padded decode: finished rows and placeholder KV are paid
    live = seqs[:2]
    assert rf.iteration_time(padded_decode(live, 3, 1200)) > rf.iteration_time(padded_decode(live, 2, 1200))
    assert rf.iteration_time(padded_decode(live, 2, 1500)) > rf.iteration_time(padded_decode(live, 2, 1200))


def test_lm_head_only_on_sampled_rows(rf):
    s = fresh(1000)
    mid = packed([s], [512])  # first chunk of a 1000-token prompt: nothing sampled
    last = packed([s], [1000])
    assert mid.sampled_tokens == 0 and last.sampled_tokens == 1
    assert rf.breakdown(mid)["lm_head"] == 0.0
    a = prefill_plan([512], [0], sampled=0)
    b = prefill_plan([512], [0], sampled=1)
    assert rf.iteration_time(b) - rf.iteration_time(a) == pytest.approx(hand_lm_head(1), rel=1e-9)
    # a 2048-token prefill samples 1 row, not 2048: the LM head term stays at the weight-read time
    assert rf.breakdown(prefill_plan([2048], [0]))["lm_head"] == pytest.approx(hand_lm_head(1), rel=1e-9)


def test_allreduce_of_the_nearest_measured_degree():
    fits = (AllReduceFit(2, 0.5, 40e-6), AllReduceFit(8, 0.8, 20e-6))
    gpu = dataclasses.replace(get_gpu("a100-80gb"), allreduce=fits)
    assert [gpu.allreduce_at(tp).tp for tp in (1, 2, 4, 5, 8, 16)] == [2, 2, 2, 8, 8, 8]  # 5: tie, the larger
    assert get_gpu("a40").allreduce_at(2) is None  # none measured: the roofline's defaults
    rf = Roofline("llama-2-70b", gpu, tp=4)
    # one all-reduce of 1 MB over 4 GPUs at tp 2's fit: 2 x 3/4 x 1e6 / (300e9 x 0.5) + 40 us = 50 us
    assert rf.allreduce_time(1e6) == pytest.approx(50e-6, rel=1e-12)
    assert Roofline("llama-2-70b", "a40", tp=2).allreduce_time(1e6) == pytest.approx(
        2 * 0.5 * 1e6 / 32e9 + 10e-6, rel=1e-12)  # PCIe at its peak, the 10 us default


def test_allreduce_only_for_tp_above_one():
    plan = prefill_plan([1000], [0])
    defaults = {"mfu": MFU, "mbu": MBU, "gemm_latency_s": 0.0}
    one = Roofline("llama-2-70b", "a100-80gb", tp=1, **defaults)
    two = Roofline("llama-2-70b", "a100-80gb", tp=2, **defaults)
    four = Roofline("llama-2-70b", "a100-80gb", tp=4, **defaults)
    assert one.breakdown(plan)["allreduce"] == 0.0
    # two all-reduces per layer of T x hidden x 2 bytes, ring: 2 (tp-1)/tp x bytes / (300 GB/s x efficiency)
    # + latency, the A100's measured ones of that degree (tp 2: 0.565, 43.7 us; tp 4: 0.536, 38.8 us)
    for rf, tp, eff, lat in ((two, 2, 0.565, 43.7e-6), (four, 4, 0.536, 38.8e-6)):
        hand = 2 * 80 * (2 * (tp - 1) / tp * 1000 * 8192 * 2 / (300e9 * eff) + lat)
        assert rf.breakdown(plan)["allreduce"] == pytest.approx(hand, rel=1e-9)
    # the linear layers split over tp (70B: 8 KV heads, so tp=2 and 4 shard them exactly)
    p70 = 80 * (8192 * (64 + 16) * 128 + 64 * 128 * 8192 + 3 * 8192 * 28672)
    lin2 = blend(2 * p70 / 2 * 1024 / (PEAK * MFU), 2 * p70 / 2 / (BW * MBU))
    assert two.breakdown(plan)["linear"] == pytest.approx(lin2, rel=1e-9)
    assert two.iteration_time(plan) < one.iteration_time(plan)


def test_kv_heads_replicate_when_tp_exceeds_them():
    rf = Roofline("llama-2-70b", "h100", tp=16)
    assert rf.kv_heads_per_gpu == 1
    assert rf.kv_bytes_per_token_per_gpu == 2 * 80 * 1 * 128 * 2


def test_decode_stretch_matches_stepping(rf):
    for rows, ctx, k in ((1, 1, 1), (32, 1024, 500), (200, 3000, 37)):
        plan = decode_plan(rows, ctx)
        fast = rf.stretch_times(plan, k)
        slow = np.array([rf.iteration_time(dataclasses.replace(plan, decode_kv=plan.decode_kv + j * rows))
                         for j in range(k)])
        generic = CostModel.stretch_times(rf, plan, k)
        assert fast.shape == (k,)
        np.testing.assert_allclose(fast, slow, rtol=1e-12)
        np.testing.assert_allclose(fast, generic, rtol=1e-12)
    assert rf.stretch_times(decode_plan(4, 10), 0).shape == (0,)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 512), ctx=st.integers(1, 32768), k=st.integers(1, 64),
       tp=st.sampled_from([1, 2, 4]))
def test_decode_stretch_property(rows, ctx, k, tp):
    rf = Roofline("llama-2-13b", "h100", tp=tp)
    plan = padded_decode([], rows, ctx)
    fast = rf.stretch_times(plan, k)
    slow = [rf.iteration_time(dataclasses.replace(plan, decode_kv=plan.decode_kv + j * rows))
            for j in range(k)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12)


def test_bad_configs_raise():
    with pytest.raises(InputError):
        Roofline("mistral-7b", "a100-80gb", tp=3)  # 32 heads
    with pytest.raises(InputError):
        Roofline("mistral-7b", "a100-80gb", mfu=1.5)
    with pytest.raises(InputError):
        Roofline("mistral-7b", "tpu")
    with pytest.raises(InputError):
        Roofline("no-such-model", "a100-80gb")
    with pytest.raises(InputError):
        Roofline("mistral-7b", "a100-80gb", tile=0)


def test_empty_plan_is_overhead(rf):
    assert rf.iteration_time(BatchPlan([], [], Layout.PACKED, 0, 0)) == pytest.approx(L * STEP_S_PER_LAYER)


def test_predicted_times_are_plausible(rf):
    # Mistral-7B on an A100: a batch-1 decode streams ~14.5 GB of weights (~7 ms at full HBM bandwidth)
    t1 = rf.iteration_time(decode_plan(1, 1024))
    assert 0.008 < t1 < 0.015
    t2048 = rf.iteration_time(prefill_plan([2048], [0]))
    assert 0.10 < t2048 < 0.20  # ~2 x 7.2e9 x 2048 FLOPs = 29.6 TFLOP at 218 TFLOP/s = 136 ms + attention
    assert isinstance(t1, float)


# ---- FP8 and the datasheet-only GPUs (costs/kv_capacity.py sizes their memory) -----------------------------
def test_fp8_weights_and_kv_halve_the_bytes_read():
    """FP8 weights: a decode's linears read half the bytes (weight streaming dominates), FP8 KV half the KV;
    the LM head stays 16-bit (vLLM's Fp8Config quantizes LinearBase layers only)."""
    bf16 = Roofline("llama-2-7b", "h100", gemm_latency_s=0.0)
    fp8 = Roofline("llama-2-7b", "h100", gemm_latency_s=0.0, weight_dtype_bytes=1, kv_dtype_bytes=1)
    assert fp8.kv_bytes_per_token_per_gpu * 2 == bf16.kv_bytes_per_token_per_gpu
    plan = decode_plan(1, 4096)
    b16, b8 = bf16.breakdown(plan), fp8.breakdown(plan)
    assert b8["decode_attention"] == pytest.approx(b16["decode_attention"] / 2, rel=1e-12)
    assert b8["linear"] == pytest.approx(b16["linear"] / 2, rel=0.01)  # the compute term is ~0 at T = 1
    assert b8["lm_head"] == b16["lm_head"]


def test_fp8_weights_compute_at_the_fp8_peak_where_the_gpu_has_it():
    """A long prefill is compute-bound: FP8 tensor cores (H100: 1,979 dense TFLOP/s) halve its linears; an
    A100 has none, so only the weight reads shrink."""
    plan = prefill_plan([4096], [0])
    for gpu, faster in (("h100", 2.0), ("a100-80gb", 1.0)):
        bf16 = Roofline("llama-2-7b", gpu, gemm_latency_s=0.0).breakdown(plan)["linear"]
        fp8 = Roofline("llama-2-7b", gpu, gemm_latency_s=0.0, weight_dtype_bytes=1).breakdown(plan)["linear"]
        assert bf16 / fp8 == pytest.approx(faster, rel=0.02)


def test_b200_and_mi300x_rooflines_beat_the_h100_on_the_same_model():
    """Datasheet-only entries: more FLOP/s and HBM bandwidth than an H100, so every step is cheaper."""
    plans = (decode_plan(64, 2048), prefill_plan([2048], [0]))
    h100 = Roofline("llama-2-70b", "h100", tp=4)
    for gpu in ("b200", "mi300x", "mi325x"):
        other = Roofline("llama-2-70b", gpu, tp=4)
        assert all(other.iteration_time(p) < h100.iteration_time(p) for p in plans), gpu
    assert "UNVALIDATED" in get_gpu("b200").description
