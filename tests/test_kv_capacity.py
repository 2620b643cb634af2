"""A deployment's KV capacity (costs/kv_capacity.py): hand-computed cases."""

from __future__ import annotations

import json
import math

import pytest
from conftest import simctl_here

from simctl.catalogue.gpus import GiB, get_gpu
from simctl.catalogue.models import MODELS, ModelSpec, get_model
from simctl.common.errors import InputError
from simctl.costs.kv_capacity import KVSizing, ReplicaMemory, VLLMProfile, kv_capacity_tokens, vllm_num_blocks

A100 = get_gpu("a100-80gb")


def test_kv_capacity_mistral_a100():
    # weights: (6,979,321,856 linear + 2 x 32000 x 4096 embedding/LM head) x 2 B = 14,482,931,712 B
    # free = 80 GiB x 0.9 - weights - 2 GiB reserve = 60,678,995,968 B; / 131,072 B per token = 462,944 tokens
    weights = (6_979_321_856 + 2 * 32000 * 4096) * 2
    hand = int((80 * GiB * 0.9 - weights - 2 * GiB) // 131_072)
    assert hand == 462944
    assert kv_capacity_tokens(get_model("mistral-7b"), A100) == hand


def test_kv_capacity_tp_shards_kv():
    one = kv_capacity_tokens(get_model("llama-2-13b"), A100)
    two = kv_capacity_tokens(get_model("llama-2-13b"), A100, tp=2)
    assert two > 2 * one  # twice the memory, and the weights are paid once per replica


def test_model_too_big_raises():
    with pytest.raises(InputError, match="does not fit"):
        kv_capacity_tokens(get_model("llama-2-70b"), A100)
    with pytest.raises(InputError, match="does not fit"):
        kv_capacity_tokens(get_model("falcon-180b"), get_gpu("l4"), tp=8)
    assert kv_capacity_tokens(get_model("llama-2-70b"), A100, tp=2) > 0


def test_moe_weights_resident_and_kv_as_its_attention() -> None:
    m = MODELS["mixtral-8x7b"]
    with pytest.raises(InputError, match="does not fit"):  # 93 GB of weights on one 80 GB GPU
        kv_capacity_tokens(m, A100)
    emb = 2 * 32000 * 4096
    per_gpu = (32 * (4096 * 128 * (16 + 2 * 4) + 16 * 128 * 4096 + 4096 * 8 + 8 * 3 * 4096 * 14336 / 2)
               + emb / 2) * 2
    assert ReplicaMemory.of(m, 2, 2).weight_bytes == pytest.approx(per_gpu, rel=1e-12)
    kv = 2 * 32 * 4 * 128 * 2  # 4 of 8 KV heads per GPU
    assert kv_capacity_tokens(m, A100, tp=2) == int((A100.memory_bytes * 0.9 - per_gpu - 2 * GiB) // kv)


# ---- as vLLM sizes it (vllm-v1 on a GPU) -------------------------------------------------------------------
CODELLAMA_34B = ModelSpec("codellama-34b", 48, 8192, 64, 8, 128, 22016, 32000, 16384)
H100 = get_gpu("h100")


def test_vllm_sizing_by_hand_codellama_34b_h100():
    """vLLM's determine_available_memory, by hand: ceil(total x 0.9) - weights - activation peak - non-torch,
    in whole blocks of 16 tokens; the pool lends all but its null block."""
    total = 81089 * 2**20  # what CUDA reports on an H100 80GB HBM3
    layer = 8192 * 128 * (64 + 2 * 8) + 64 * 128 * 8192 + 3 * 8192 * 22016  # QKV, O, gate/up/down
    weights = (48 * layer + 2 * 32000 * 8192) * 2
    activation = 4096 * (4 * 8192 + 3 * 22016) * 2  # max_num_batched_tokens 4096
    block = 16 * 2 * 48 * 8 * 128 * 2  # 16 tokens of K and V, 8 KV heads
    blocks = (math.ceil(total * 0.9) - weights - activation - 240 * 2**20) // block
    assert blocks == 2536
    profile = VLLMProfile(4096, 16)
    assert vllm_num_blocks(CODELLAMA_34B, H100, 1, 2, KVSizing(), profile) == blocks
    assert kv_capacity_tokens(CODELLAMA_34B, H100, profile=profile) == (blocks - 1) * 16


def test_a_smaller_profiled_step_leaves_more_kv():
    """vLLM profiles a forward of max_num_batched_tokens: 64 tokens hold back (4096 - 64) tokens' activations
    less than 4096, which the KV cache gets, to a block."""
    block = 16 * 2 * 48 * 8 * 128 * 2
    small, big = (vllm_num_blocks(CODELLAMA_34B, H100, 1, 2, KVSizing(), VLLMProfile(n, 16))
                  for n in (64, 4096))
    freed = (4096 - 64) * (4 * 8192 + 3 * 22016) * 2
    assert abs((small - big) * block - freed) < block


def test_memory_utilization_and_given_sizes():
    m = get_model("llama-2-7b")
    low, high = (kv_capacity_tokens(m, H100, sizing=KVSizing(gpu_memory_utilization=u)) for u in (0.5, 0.9))
    assert abs(high - low - 0.4 * H100.memory_bytes / m.kv_bytes_per_token()) <= 1
    assert kv_capacity_tokens(m, H100, sizing=KVSizing(kv_cache_tokens=5000)) == 5000
    override = KVSizing(num_gpu_blocks_override=100)
    assert kv_capacity_tokens(m, H100, sizing=override, profile=VLLMProfile(2048, 16)) == 99 * 16
    with pytest.raises(InputError, match="vllm-v1"):
        kv_capacity_tokens(m, H100, sizing=override)
    for bad in ({"gpu_memory_utilization": 1.5}, {"dtype": "int4"}, {"kv_cache_dtype": "fp4"},
                {"kv_cache_tokens": 0}, {"kv_cache_tokens": 10, "num_gpu_blocks_override": 10}):
        with pytest.raises(InputError):
            KVSizing(**bad)


# ---- FP8 ---------------------------------------------------------------------------------------------------
def test_fp8_kv_halves_the_bytes_per_token_and_doubles_the_cache():
    m = get_model("llama-2-7b")
    bf16, fp8 = (ReplicaMemory.of(m, 1, 2, KVSizing(kv_cache_dtype=d)) for d in ("auto", "fp8"))
    assert fp8.kv_bytes_per_token * 2 == bf16.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert fp8.weight_bytes == bf16.weight_bytes
    one, two = (kv_capacity_tokens(m, A100, sizing=KVSizing(kv_cache_dtype=d)) for d in ("auto", "fp8"))
    assert two in (2 * one, 2 * one + 1)


def test_fp8_weights_are_the_linears_in_one_byte():
    m = get_model("llama-2-7b")
    fp8 = ReplicaMemory.of(m, 1, 2, KVSizing(dtype="fp8"))
    assert fp8.weight_bytes == m.linear_params * 1 + m.embedding_lm_head_params * 2  # LM head stays 16-bit
    assert kv_capacity_tokens(m, A100, sizing=KVSizing(dtype="fp8")) > kv_capacity_tokens(m, A100)


def test_the_run_command_sizes_kv_from_its_options():
    """`simctl run`: vllm-v1 on an H100 sized as vLLM sizes it, FP8 KV doubling it, a bad share refused."""
    def kv(*extra: str) -> int:
        done = simctl_here("run", "--policy", "vllm-v1", "--gpu", "h100", "--model", "llama-2-7b",
                           "--num-requests", "5", "--scale", "0.1", "--json", *extra)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)["kv_capacity_tokens"]

    profile = VLLMProfile(8192, 16)  # vLLM's serving defaults on an H100 (policies/vllm_v1.py)
    m = get_model("llama-2-7b")
    assert kv() == kv_capacity_tokens(m, H100, profile=profile)
    assert kv("--kv-cache-dtype", "fp8") == kv_capacity_tokens(m, H100, sizing=KVSizing(kv_cache_dtype="fp8"),
                                                               profile=profile)
    assert kv("--kv-cache-tokens", "4000") == 4000
    bad = simctl_here("run", "--gpu-memory-utilization", "0", "--num-requests", "5")
    assert bad.returncode == 2 and "--gpu-memory-utilization must be in (0, 1]" in bad.stderr


def test_a_fit_prices_only_the_dtype_it_profiled():
    from simctl.costs.loader import RooflineOptions, default_cost_path, load_cost

    cpu = get_gpu("cpu")
    with pytest.raises(InputError, match="the dtype it profiled"):
        load_cost(default_cost_path(cpu), get_model("tiny"), cpu, 1, RooflineOptions(weight_dtype_bytes=1))
