"""--model PATH: shapes read from a transformers config.json (written to tmp_path; nothing is downloaded),
checked, and used by the roofline, the simulator's CLI and the engine's model builder."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from common.errors import InputError
from policies.plan import hybrid
from policies.seq import Seq
from sim.cost.roofline import Roofline
from sim.models import MODELS, get_model

pytestmark = pytest.mark.cli

# Mistral-7B-v0.1's published config.json (the fields simctl reads, plus a few it ignores)
MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "vocab_size": 32000, "max_position_embeddings": 32768,
           "hidden_act": "silu", "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
TINY = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
        "max_position_embeddings": 512}


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
    assert Roofline(spec, "a100-80gb").iteration_time(plan) == Roofline("mistral-7b", "a100-80gb").iteration_time(plan)


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
    ({"model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "num_local_experts": 8},
     "mixture-of-experts"),
    ({"model_type": "qwen2_moe", "architectures": ["Qwen2MoeForCausalLM"]}, "mixture-of-experts"),
    ({"num_experts": 60}, "mixture-of-experts config (num_experts)"),
])
def test_bad_configs_are_refused(tmp_path: Path, change: dict, needle: str) -> None:
    config = {k: v for k, v in {**TINY, **change}.items() if v is not None}
    with pytest.raises(InputError) as e:
        get_model(write(tmp_path, config))
    assert needle in str(e.value) and "\n" not in str(e.value)


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
    res = subprocess.run([str(simctl), "run", "--model", bad, "--num-requests", "50"], capture_output=True,
                         text=True, timeout=120, check=False)
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "num_key_value_heads (5)" in res.stderr


def test_engine_builds_the_configured_shape(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from executor.model import build_model

    model = build_model(get_model(write(tmp_path, TINY)))
    c = model.config
    assert (c.hidden_size, c.num_hidden_layers, c.num_attention_heads, c.num_key_value_heads, c.vocab_size,
            c.intermediate_size) == (64, 2, 4, 2, 256, 128)
    assert sum(p.numel() for n, p in model.named_parameters() if "norm" not in n) == get_model(
        write(tmp_path, TINY)).total_params
