"""--model PATH: shapes read from a transformers config.json (written to tmp_path; nothing is downloaded),
checked, and used by the roofline, the simulator's CLI and the engine's model builder."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import simctl_here

from simctl.catalogue.models import MODELS, get_model
from simctl.catalogue.moe import MoE
from simctl.common.errors import InputError
from simctl.costs.roofline import Roofline
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq

pytestmark = pytest.mark.cli

# Mistral-7B-v0.1's published config.json (the fields simctl reads, plus a few it ignores)
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
           "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 256, "max_position_embeddings": 512}
QWEN_MOE = {"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"], "num_experts": 4,
            "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64}
# mistralai/Mixtral-8x7B-v0.1's published config.json (the fields simctl reads, plus a few it ignores)
MIXTRAL = {**MISTRAL, "architectures": ["MixtralForCausalLM"], "model_type": "mixtral",
           "num_local_experts": 8, "num_experts_per_tok": 2, "rope_theta": 1e6, "sliding_window": None,
           "router_aux_loss_coef": 0.02}
# Qwen/Qwen1.5-MoE-A2.7B's published config.json: 60 experts of 1408, top-4, a shared expert of 5632
QWEN15_MOE = {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": 2048,
              "intermediate_size": 5632, "moe_intermediate_size": 1408,
              "shared_expert_intermediate_size": 5632, "num_experts": 60, "num_experts_per_tok": 4,
              "decoder_sparse_step": 1, "norm_topk_prob": False, "num_hidden_layers": 24,
              "num_attention_heads": 16, "num_key_value_heads": 16, "vocab_size": 151936,
              "max_position_embeddings": 8192, "hidden_act": "silu", "tie_word_embeddings": False}
# Qwen/Qwen3-30B-A3B's published config.json
QWEN3_MOE = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
             "intermediate_size": 6144, "moe_intermediate_size": 768, "num_experts": 128,
             "num_experts_per_tok": 8, "decoder_sparse_step": 1, "mlp_only_layers": [],
             "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
             "vocab_size": 151936, "max_position_embeddings": 40960, "hidden_act": "silu",
             "tie_word_embeddings": False, "norm_topk_prob": True}


def write(tmp_path: Path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_mistral_config_is_the_catalogue_shape(tmp_path: Path) -> None:
    path = write(tmp_path, MISTRAL)
    spec = get_model(path)
    assert replace(spec, name="mistral-7b", description="") == replace(MODELS["mistral-7b"], description="")
    seqs = [Seq(i, 0.0, 100 * (i + 1), 5) for i in range(4)]
    plan = hybrid([], seqs, [s.prompt_tokens for s in seqs])
    assert (Roofline(spec, "a100-80gb").iteration_time(plan)
            == Roofline("mistral-7b", "a100-80gb").iteration_time(plan))


def test_defaults_and_families(tmp_path: Path) -> None:
    llama = {k: v for k, v in TINY.items() if k != "num_key_value_heads"}  # absent: multi-head attention
    spec = get_model(write(tmp_path, llama))
    assert (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.tie_word_embeddings) == (4, 4, 16, False)
    qwen = {**TINY, "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "tie_word_embeddings": True,
            "head_dim": 32}
    spec = get_model(write(tmp_path, qwen, "qwen.json"))
    assert (spec.head_dim, spec.tie_word_embeddings, spec.embedding_lm_head_params) == (32, True, 256 * 64)
    yi = {**TINY, "model_type": "yi", "architectures": ["YiForCausalLM"]}
    assert get_model(write(tmp_path, yi, "yi.json")).num_layers == 2


@pytest.mark.parametrize(("change", "needle"), [
    ({"hidden_size": 66}, "num_attention_heads (4) must divide hidden_size (66)"),
    ({"num_key_value_heads": 3}, "num_key_value_heads (3) must divide num_attention_heads (4)"),
    ({"num_hidden_layers": 0}, "num_hidden_layers must be a positive integer"),
    ({"vocab_size": 25.5}, "vocab_size must be a positive integer"),
    ({"intermediate_size": True}, "intermediate_size must be a positive integer"),
    ({"max_position_embeddings": None}, "max_position_embeddings is missing"),
    ({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}, "model_type 'gpt2'"),
    ({"architectures": ["T5ForConditionalGeneration"]}, "architectures"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings"),
    ({"num_experts": 60}, "is dense but the config has mixture-of-experts fields (num_experts)"),
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_experts_per_tok": 2},
     "num_local_experts is missing"),
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 2,
      "num_experts_per_tok": 3}, "config.json: moe: experts_per_token (3) exceeds the 2 experts"),
    ({**QWEN_MOE, "mlp_only_layers": [0, 1]}, "no layer is sparse"),
    ({**QWEN_MOE, "mlp_only_layers": [5]}, "mlp_only_layers must list layer indices below 2"),
    ({"model_type": "dbrx", "architectures": ["DbrxForCausalLM"]}, "model_type 'dbrx'"),
    ({"model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"], "kv_lora_rank": 512},
     "deepseek_v3 uses multi-head latent attention (kv_lora_rank 512), which simctl does not price"),
])
def test_bad_configs_are_refused(tmp_path: Path, change: dict, needle: str) -> None:
    config = {k: v for k, v in {**TINY, **change}.items() if v is not None}
    with pytest.raises(InputError) as e:
        get_model(write(tmp_path, config))
    assert needle in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(("config", "name"), [(MIXTRAL, "mixtral-8x7b"), (QWEN3_MOE, "qwen3-30b-a3b")])
def test_moe_configs_are_the_catalogue_shapes(tmp_path: Path, config: dict, name: str) -> None:
    spec = get_model(write(tmp_path, config))
    assert replace(spec, name=name, description="") == replace(MODELS[name], description="")


def test_qwen2_moe_shared_expert_and_dense_layers(tmp_path: Path) -> None:
    spec = get_model(write(tmp_path, QWEN15_MOE))
    assert spec.moe == MoE(experts=60, experts_per_token=4, expert_size=1408, shared_size=5632)
    # published: 14.3B parameters, 2.7B activated
    assert round(spec.total_params / 1e9, 1) == 14.3 and round(spec.active_params / 1e9, 1) == 2.7
    # transformers' rule: layer i sparse unless listed in mlp_only_layers or (i + 1) % decoder_sparse_step
    few = {**QWEN15_MOE, "num_hidden_layers": 8, "decoder_sparse_step": 2, "mlp_only_layers": [1, 2]}
    spec = get_model(write(tmp_path, few, "few.json"))
    assert spec.moe.dense_layers == 5 and spec.sparse_layers == 3  # sparse: layers 3, 5, 7
    assert "dense layers of 5632" in spec.description


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="no such file"):
        get_model(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        get_model(str(tmp_path / "bad.json"))
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(InputError, match="JSON object"):
        get_model(str(tmp_path / "list.json"))
    with pytest.raises(InputError, match="unknown model 'nomodel'"):
        get_model("nomodel")


def test_cli_runs_a_config_and_refuses_a_bad_one(tmp_path: Path) -> None:
    simctl = Path(sys.executable).parent / "simctl"
    path = write(tmp_path, MISTRAL)
    ok = subprocess.run([str(simctl), "run", "--model", path, "--trace", "sharegpt", "--num-requests", "50",
                         "--json"], capture_output=True, text=True, timeout=120, check=False)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["model"] == path
    bad = write(tmp_path, {**MISTRAL, "num_key_value_heads": 5}, "bad.json")
    res = simctl_here("run", "--model", bad, "--num-requests", "50")  # bad input: refused in-process
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "num_key_value_heads (5)" in res.stderr
    # a mixture of experts simctl cannot price: DeepSeek-V3's latent attention
    mla = write(tmp_path, {**MIXTRAL, "model_type": "deepseek_v3", "architectures": ["DeepseekV3ForCausalLM"],
                           "kv_lora_rank": 512, "n_routed_experts": 256}, "mla.json")
    res = simctl_here("run", "--model", mla, "--num-requests", "50")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "latent attention" in res.stderr


def test_engine_builds_the_configured_shape(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from simctl.executor.model import build_model

    model = build_model(get_model(write(tmp_path, TINY)))
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
            c.intermediate_size) == (64, 2, 4, 2, 256, 128)
    assert sum(p.numel() for n, p in model.named_parameters() if "norm" not in n) == get_model(
        write(tmp_path, TINY)).total_params


# Qwen/Qwen3-0.6B's published config.json (its heads x head_dim, 2048, is twice its hidden size)
QWEN3_DENSE = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
               "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
               "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
               "max_position_embeddings": 40960, "hidden_act": "silu", "attention_bias": False,
               "rms_norm_eps": 1e-06, "rope_theta": 1000000, "tie_word_embeddings": True,
               "torch_dtype": "bfloat16"}


def test_qwen3_dense_and_a_model_folder(tmp_path: Path) -> None:
    """Issue 35: a Qwen3 dense config.json was refused, and a model's folder was an unknown model."""
    folder = tmp_path / "Qwen3-0.6B"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(QWEN3_DENSE))
    for given in (folder / "config.json", folder):
        spec = get_model(str(given))
        assert (spec.num_layers, spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.moe) == (
            28, 16, 8, 128, None)
        assert spec.description.startswith("qwen3 from ")
    # q, k, v and o projections: 1024 x (16 + 2 x 8) x 128 and 16 x 128 x 1024 per layer
    assert (spec.qkv_params_per_layer, spec.o_params_per_layer) == (1024 * 32 * 128, 16 * 128 * 1024)
    assert Roofline(spec, "a100-80gb").iteration_time(hybrid([], [Seq(0, 0.0, 512, 2)], [512])) > 0
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match="holds no config.json"):
        get_model(str(empty))


def test_a_model_folder_runs_in_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from simctl.cli import main

    (tmp_path / "config.json").write_text(json.dumps(QWEN3_DENSE))
    with pytest.raises(SystemExit) as done:
        main(["run", "--model", str(tmp_path), "--trace", "sharegpt", "--num-requests", "20", "--json"])
    assert done.value.code == 0
    assert json.loads(capsys.readouterr().out)["model"] == str(tmp_path)
