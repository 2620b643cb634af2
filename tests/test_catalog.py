"""The model and GPU catalogues: shapes, derived sizes, lookups."""

import pytest

from simctl.catalogue.gpus import GPUS, GPUSpec, get_gpu
from simctl.catalogue.models import MODELS, ModelSpec, get_model
from simctl.common.errors import InputError


def test_llama2_7b_param_counts():
    m = get_model("llama-2-7b")
    h, f, L = 4096, 11008, 32
    assert m.qkv_params_per_layer == 3 * h * h
    assert m.o_params_per_layer == h * h
    assert m.mlp_params_per_layer == 3 * h * f
    assert m.linear_params == L * (4 * h * h + 3 * h * f)
    assert m.linear_params == pytest.approx(6.48e9, rel=0.01)
    assert m.embedding_lm_head_params == 2 * 32000 * h
    assert m.total_params == pytest.approx(6.74e9, rel=0.01)  # the published "7B" is 6.74e9
    assert m.weight_bytes(2) == 2 * m.total_params


@pytest.mark.parametrize("name,billions", [
    ("llama-2-13b", 13.0), ("llama-2-70b", 69.0), ("mistral-7b", 7.24), ("llama-3-8b", 8.03),
    ("yi-34b", 34.4), ("falcon-180b", 179.0),
    # model cards' sizes (Qwen's "Number of Parameters"; Llama 3.1's safetensors totals)
    ("llama-3.1-8b", 8.03), ("llama-3.1-70b", 70.6), ("qwen2.5-7b", 7.61), ("qwen2.5-32b", 32.5),
    ("qwen2.5-72b", 72.7), ("qwen3-8b", 8.2), ("qwen3-32b", 32.8),
])
def test_total_params_match_published_sizes(name, billions):
    assert get_model(name).total_params == pytest.approx(billions * 1e9, rel=0.01)


def test_kv_bytes_per_token():
    assert get_model("mistral-7b").kv_bytes_per_token(2) == 2 * 32 * 8 * 128 * 2 == 131072
    assert get_model("llama-2-7b").kv_bytes_per_token(2) == 2 * 32 * 32 * 128 * 2
    assert get_model("llama-2-70b").kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2
    assert get_model("falcon-180b").kv_bytes_per_token(1) == 2 * 80 * 8 * 64


def test_gqa_qkv_and_plain_mlp():
    m = get_model("mistral-7b")
    assert m.qkv_params_per_layer == 4096 * (32 + 2 * 8) * 128
    f = get_model("falcon-180b")
    assert f.mlp == "plain" and f.mlp_matrices == 2
    assert f.mlp_params_per_layer == 2 * 14848 * 4 * 14848
    assert f.tie_word_embeddings and f.embedding_lm_head_params == 65024 * 14848
    assert f.head_dim * f.num_heads == f.hidden_size


def test_catalogue_is_consistent():
    for name, m in MODELS.items():
        assert m.name == name and m.description
        assert m.num_heads % m.num_kv_heads == 0
    for name, g in GPUS.items():
        assert g.name == name and g.description and g.tile >= 1
    tiny, tiny2 = get_model("tiny"), get_model("tiny-2l")
    assert (tiny.num_layers, tiny2.num_layers) == (4, 2)
    assert tiny.hidden_size == tiny.num_heads * tiny.head_dim
    assert "PLACEHOLDER" in get_gpu("cpu").description


def test_gpu_specs():
    a100 = get_gpu("a100-80gb")
    assert (a100.peak_flops, a100.mem_bandwidth, a100.memory_bytes) == (312e12, 2039e9, 80 * 2**30)
    assert a100.tile == 128
    assert (get_gpu("h100").peak_flops, get_gpu("h200").mem_bandwidth) == (989e12, 4800e9)
    assert get_gpu("L4").mem_bandwidth == 300e9  # case-insensitive


def test_unknown_names_raise_and_list_known():
    with pytest.raises(InputError, match="mistral-7b"):
        get_model("gpt-5")
    with pytest.raises(InputError, match="a100-80gb"):
        get_gpu("tpu-v9")


def test_invalid_specs_raise():
    with pytest.raises(InputError):
        ModelSpec("bad", 2, 256, 6, 4, 64, 688, 100, 128)  # 6 heads not a multiple of 4 KV heads
    with pytest.raises(InputError):
        ModelSpec("bad", 0, 256, 4, 2, 64, 688, 100, 128)
    with pytest.raises(InputError):
        GPUSpec("bad", 0.0, 1e9, 1, 1e9)
