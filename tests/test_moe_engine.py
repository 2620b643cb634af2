"""The tiny mixture-of-experts model in simctl's executor: transformers' Mixtral with random weights (nothing
downloaded), its router really routing; the ragged executor's logits equal transformers' own forward."""

from __future__ import annotations

import pytest
import torch

from simctl.catalogue.models import MODELS, get_model
from simctl.common.errors import InputError
from simctl.executor.model import build_model, llama_config, reference_model
from simctl.executor.ragged import RaggedExecutor, Segment

pytestmark = pytest.mark.torch


def test_tiny_moe_runs_ragged_as_the_reference_and_routes_unevenly() -> None:
    spec = get_model("tiny-moe")
    model = build_model(spec, "cpu", "float32", seed=0)
    assert type(model).__name__ == "MixtralForCausalLM"
    assert sum(p.numel() for n, p in model.named_parameters() if "norm" not in n) == spec.total_params
    ref = reference_model(model)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, spec.vocab_size, (n,), generator=g) for n in (7, 30, 3)]
    with torch.inference_mode():
        expect = torch.stack([ref(input_ids=p[None], use_cache=False).logits[0, -1] for p in prompts])
    ex = RaggedExecutor(model, 4, 64)
    ex.run([Segment(i, p[:-1]) for i, p in enumerate(prompts)])
    out = ex.run([Segment(i, p[-1:], len(p) - 1) for i, p in enumerate(prompts)])
    assert (out - expect).abs().max() < 1e-5
    # the router picks experts per token: 40 tokens of layer 0 reach more than the 2 experts of one token
    gate = model.model.layers[0].mlp.gate
    hidden = model.model.embed_tokens(torch.cat(prompts))
    with torch.inference_mode():
        chosen = gate(hidden)[2]
    assert chosen.shape == (40, 2) and len(chosen.unique()) > 2


def test_shapes_that_cannot_be_built() -> None:
    with pytest.raises(InputError, match="is a mixture of experts"):
        llama_config(MODELS["tiny-moe"])
    from dataclasses import replace

    shared = replace(MODELS["tiny-moe"], moe=replace(MODELS["tiny-moe"].moe, shared_size=64))
    with pytest.raises(InputError, match="without shared experts"):
        build_model(shared)


def test_vllm_builds_the_moe_as_mixtral() -> None:
    from simctl.executor.vllm_runtime import model_config_json

    config = model_config_json(get_model("tiny-moe"), "float32")
    assert config["architectures"] == ["MixtralForCausalLM"]
    moe = (config["num_local_experts"], config["num_experts_per_tok"], config["intermediate_size"])
    assert moe == (8, 2, 344)
    assert model_config_json(get_model("tiny"), "float32")["architectures"] == ["LlamaForCausalLM"]


@pytest.mark.vllm
def test_vllm_serves_the_tiny_moe() -> None:
    pytest.importorskip("vllm")
    from simctl.engine.vllm_real import VLLMServer
    from simctl.executor.vllm_runtime import VLLMEngineArgs
    from simctl.traces.request import Request

    requests = [Request(i, 0.02 * i, 5 + (i * 37) % 300, 1 + i % 6) for i in range(8)]
    with VLLMServer("tiny-moe", VLLMEngineArgs(max_model_len=2048)) as server:
        req = server.serve(requests).result.requests
    assert (req["generated_tokens"] == req["output_tokens"]).all() and (req["completion_s"] > 0).all()
