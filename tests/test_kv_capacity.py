"""A deployment's KV capacity (costs/kv_capacity.py): hand-computed cases."""

from __future__ import annotations

import pytest

from simctl.catalogue.gpus import GiB, get_gpu
from simctl.catalogue.models import MODELS, get_model
from simctl.common.errors import InputError
from simctl.costs.kv_capacity import ReplicaMemory, kv_capacity_tokens

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
    assert ReplicaMemory.of(m, 2, 2, A100.memory_bytes).weight_bytes == pytest.approx(per_gpu, rel=1e-12)
    kv = 2 * 32 * 4 * 128 * 2  # 4 of 8 KV heads per GPU
    assert kv_capacity_tokens(m, A100, tp=2) == int((A100.memory_bytes * 0.9 - per_gpu - 2 * GiB) // kv)
