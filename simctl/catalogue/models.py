"""Transformer shapes the cost models price: a catalogue of public decoder-only LLMs plus tiny CPU shapes.

Only what a cost model needs is kept: layer count, widths, attention heads (GQA), MLP kind, vocabulary and,
for a mixture-of-experts model, its sparse layers' experts (`catalogue.moe.MoE`). Parameter counts cover the
matrices that dominate compute and memory traffic (QKV, O, MLP or router and experts, embedding and LM head);
norms, biases, rotary tables and Qwen2-MoE's one-column shared-expert gate are left out (well under 0.1% of
the weights of every model here).

Shapes are published facts, each cited to the model's public `config.json` on its Hugging Face hub page.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from simctl.catalogue.model_config import is_config_path, read_model_config
from simctl.catalogue.moe import MoE
from simctl.common.errors import InputError
from simctl.common.files import in_working_folder
from simctl.traces.request import Request

MlpKind = Literal["gated", "plain"]


@dataclass(frozen=True, slots=True)
class ModelSpec:
    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position: int
    mlp: MlpKind = "gated"  # gated: SwiGLU, 3 matrices (gate, up, down); plain: 2 matrices (up, down)
    tie_word_embeddings: bool = False  # LM head shares the embedding matrix (stored and read once)
    description: str = ""
    moe: MoE | None = None  # mixture of experts: the sparse layers' MLP (None: every layer dense)

    def __post_init__(self) -> None:
        for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim", "intermediate_size",
                  "vocab_size", "max_position"):
            v = getattr(self, f)
            if not isinstance(v, int) or v <= 0:
                raise InputError(f"model {self.name!r}: {f} must be a positive integer, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise InputError(f"model {self.name!r}: num_heads ({self.num_heads}) must be a multiple of "
                             f"num_kv_heads ({self.num_kv_heads})")
        if self.mlp not in ("gated", "plain"):
            raise InputError(f"model {self.name!r}: mlp must be 'gated' or 'plain', got {self.mlp!r}")
        if isinstance(self.moe, dict):  # read back from a JSON model shape (asdict of a spec)
            object.__setattr__(self, "moe", MoE(**self.moe))
        if self.moe is not None and self.moe.dense_layers >= self.num_layers:
            raise InputError(f"model {self.name!r}: {self.moe.dense_layers} dense layers leave none of its "
                             f"{self.num_layers} layers sparse")

    def context_overrun(self, requests: Sequence[Request]) -> str | None:
        """What the longest request needs beyond the model's context (its positions); None if all fit."""
        longest = max(requests, key=lambda r: r.prompt_tokens + r.output_tokens)
        need = longest.prompt_tokens + longest.output_tokens
        if need <= self.max_position:
            return None
        return (f"request {longest.id} needs {need} positions ({longest.prompt_tokens} prompt + "
                f"{longest.output_tokens} output) but {self.name} has a context of {self.max_position}")

    def check_context(self, requests: Sequence[Request], scale: float = 1.0) -> None:
        """InputError unless every request's prompt and output fit in the model's context (its positions)."""
        overrun = self.context_overrun(requests)
        if overrun is not None:
            raise InputError(f"{overrun}; lower --scale (now {scale:g}), or use a shorter trace or a model "
                             "with a longer context")

    # ---- parameters of the linear layers, per layer -------------------------------------------------------
    @property
    def qkv_params_per_layer(self) -> int:
        return self.hidden_size * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @property
    def o_params_per_layer(self) -> int:
        return self.num_heads * self.head_dim * self.hidden_size

    @property
    def mlp_matrices(self) -> int:
        return 3 if self.mlp == "gated" else 2

    @property
    def mlp_params_per_layer(self) -> int:
        """The dense MLP's (a dense model's every layer; an MoE's `moe.dense_layers`)."""
        return self.mlp_matrices * self.hidden_size * self.intermediate_size

    @property
    def attention_params_per_layer(self) -> int:
        return self.qkv_params_per_layer + self.o_params_per_layer

    # ---- mixture of experts: per sparse layer ------------------------------------------------------------
    @property
    def sparse_layers(self) -> int:
        return 0 if self.moe is None else self.num_layers - self.moe.dense_layers

    @property
    def router_params(self) -> int:
        return 0 if self.moe is None else self.hidden_size * self.moe.experts

    @property
    def expert_params(self) -> int:
        """One routed expert's MLP."""
        return 0 if self.moe is None else self.mlp_matrices * self.hidden_size * self.moe.expert_size

    @property
    def shared_expert_params(self) -> int:
        return 0 if self.moe is None else self.mlp_matrices * self.hidden_size * self.moe.shared_size

    def _linear_params(self, experts: int) -> int:
        """QKV + O + MLP over all layers, a sparse layer counting its router, shared experts and `experts`
        routed experts."""
        if self.moe is None:
            return self.num_layers * (self.attention_params_per_layer + self.mlp_params_per_layer)
        dense = self.moe.dense_layers
        return (self.num_layers * self.attention_params_per_layer + dense * self.mlp_params_per_layer
                + self.sparse_layers * (self.router_params + self.shared_expert_params
                                        + experts * self.expert_params))

    @property
    def linear_params(self) -> int:
        """QKV + O + MLP over all layers as stored (every expert of an MoE)."""
        return self._linear_params(self.moe.experts if self.moe else 0)

    @property
    def active_linear_params(self) -> int:
        """The linear parameters one token goes through: an MoE's router, shared and k routed experts (a dense
        model's all)."""
        return self._linear_params(self.moe.experts_per_token if self.moe else 0)

    # ---- embedding and LM head --------------------------------------------------------------------------
    @property
    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """Parameters the LM head multiplies by (whether or not they are tied to the embedding)."""
        return self.vocab_size * self.hidden_size

    @property
    def embedding_lm_head_params(self) -> int:
        """Stored parameters of embedding + LM head (once if tied)."""
        return self.embedding_params + (0 if self.tie_word_embeddings else self.lm_head_params)

    @property
    def total_params(self) -> int:
        return self.linear_params + self.embedding_lm_head_params

    @property
    def active_params(self) -> int:
        return self.active_linear_params + self.embedding_lm_head_params

    def weight_bytes(self, dtype_bytes: int = 2) -> int:
        """Every weight resident (all of an MoE's experts)."""
        return self.total_params * dtype_bytes

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        """K and V of one token over all layers: 2 x layers x kv_heads x head_dim x dtype bytes."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes


MODELS: dict[str, ModelSpec] = {m.name: m for m in [
    # source: meta-llama/Llama-2-7b-hf config.json (hidden 4096, 32 layers, 32 heads, no GQA,
    # intermediate 11008, vocab 32000, max_position_embeddings 4096, tie_word_embeddings false)
    ModelSpec("llama-2-7b", 32, 4096, 32, 32, 128, 11008, 32000, 4096,
              description="Llama-2-7B: 32 layers, d=4096, MHA 32 heads, SwiGLU 11008"),
    # source: princeton-nlp/Sheared-LLaMA-1.3B config.json (hidden 2048, 24 layers, 16 heads, no GQA,
    # intermediate 5504, vocab 32000, max_position_embeddings 4096): Prepacking's 1.3B model
    ModelSpec("sheared-llama-1.3b", 24, 2048, 16, 16, 128, 5504, 32000, 4096,
              description="Sheared-LLaMA-1.3B: 24 layers, d=2048, MHA 16 heads, SwiGLU 5504"),
    # source: meta-llama/Llama-2-13b-hf config.json (hidden 5120, 40 layers, 40 heads, intermediate 13824)
    ModelSpec("llama-2-13b", 40, 5120, 40, 40, 128, 13824, 32000, 4096,
              description="Llama-2-13B: 40 layers, d=5120, MHA 40 heads, SwiGLU 13824"),
    # source: meta-llama/Llama-2-70b-hf config.json (hidden 8192, 80 layers, 64 heads, 8 KV heads,
    # intermediate 28672)
    ModelSpec("llama-2-70b", 80, 8192, 64, 8, 128, 28672, 32000, 4096,
              description="Llama-2-70B: 80 layers, d=8192, GQA 64/8 heads, SwiGLU 28672"),
    # source: mistralai/Mistral-7B-v0.1 config.json (hidden 4096, 32 layers, 32 heads, 8 KV heads,
    # intermediate 14336, vocab 32000, max_position_embeddings 32768; its sliding_window 4096 is not modelled)
    ModelSpec("mistral-7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
              description="Mistral-7B-v0.1: 32 layers, d=4096, GQA 32/8 heads, SwiGLU 14336"),
    # source: meta-llama/Meta-Llama-3-8B config.json (hidden 4096, 32 layers, 32 heads, 8 KV heads,
    # intermediate 14336, vocab 128256, max_position_embeddings 8192, tie_word_embeddings false)
    ModelSpec("llama-3-8b", 32, 4096, 32, 8, 128, 14336, 128256, 8192,
              description="Llama-3-8B: 32 layers, d=4096, GQA 32/8 heads, SwiGLU 14336, vocab 128k"),
    # source: 01-ai/Yi-34B config.json (hidden 7168, 60 layers, 56 heads, 8 KV heads, intermediate 20480,
    # vocab 64000, max_position_embeddings 4096, tie_word_embeddings false)
    ModelSpec("yi-34b", 60, 7168, 56, 8, 128, 20480, 64000, 4096,
              description="Yi-34B: 60 layers, d=7168, GQA 56/8 heads, SwiGLU 20480"),
    # source: tiiuae/falcon-180B config.json (hidden 14848, 80 layers, 232 heads, num_kv_heads 8,
    # vocab 65024, new_decoder_architecture, parallel attention; head_dim = 14848/232 = 64; plain GELU MLP
    # of 4 x hidden = 59392; tie_word_embeddings not set, so the transformers FalconConfig default (tied))
    ModelSpec("falcon-180b", 80, 14848, 232, 8, 64, 4 * 14848, 65024, 2048, mlp="plain",
              tie_word_embeddings=True,
              description="Falcon-180B: 80 layers, d=14848, GQA 232/8 heads (dim 64), GELU MLP 4x"),
    # source: mistralai/Mixtral-8x7B-v0.1 config.json (hidden 4096, 32 layers, 32 heads, 8 KV heads,
    # intermediate_size 14336 per expert, num_local_experts 8, num_experts_per_tok 2, vocab 32000,
    # max_position_embeddings 32768, tie_word_embeddings false): 46.7B parameters, 12.9B active
    ModelSpec("mixtral-8x7b", 32, 4096, 32, 8, 128, 14336, 32000, 32768,
              moe=MoE(experts=8, experts_per_token=2, expert_size=14336),
              description=("Mixtral-8x7B: 32 layers, d=4096, GQA 32/8 heads, 8 SwiGLU experts of 14336, "
                           "top-2")),
    # source: Qwen/Qwen3-30B-A3B config.json (hidden 2048, 48 layers, 32 heads, 4 KV heads, head_dim 128,
    # intermediate_size 6144 (unused: mlp_only_layers empty, decoder_sparse_step 1), num_experts 128,
    # num_experts_per_tok 8, moe_intermediate_size 768, vocab 151936, max_position_embeddings 40960,
    # tie_word_embeddings false): 30.5B parameters, 3.3B active
    ModelSpec("qwen3-30b-a3b", 48, 2048, 32, 4, 128, 6144, 151936, 40960,
              moe=MoE(experts=128, experts_per_token=8, expert_size=768),
              description=("Qwen3-30B-A3B: 48 layers, d=2048, GQA 32/4 heads, 128 SwiGLU experts of 768, "
                           "top-8")),
    # source: meta-llama/Llama-3.1-8B config.json (hidden 4096, 32 layers, 32 heads, 8 KV heads, intermediate
    # 14336, vocab 128256, max_position_embeddings 131072 with llama3 rope_scaling, tie_word_embeddings false)
    ModelSpec("llama-3.1-8b", 32, 4096, 32, 8, 128, 14336, 128256, 131072,
              description="Llama-3.1-8B: 32 layers, d=4096, GQA 32/8 heads, SwiGLU 14336, 128k context"),
    # source: meta-llama/Llama-3.1-70B config.json (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate
    # 28672, vocab 128256, max_position_embeddings 131072, tie_word_embeddings false)
    ModelSpec("llama-3.1-70b", 80, 8192, 64, 8, 128, 28672, 128256, 131072,
              description="Llama-3.1-70B: 80 layers, d=8192, GQA 64/8 heads, SwiGLU 28672, 128k context"),
    # source: Qwen/Qwen2.5-7B config.json (hidden 3584, 28 layers, 28 heads, 4 KV heads, intermediate 18944,
    # vocab 152064, max_position_embeddings 131072, tie_word_embeddings false; the Instruct model's config
    # says 32768, extended with YaRN)
    ModelSpec("qwen2.5-7b", 28, 3584, 28, 4, 128, 18944, 152064, 131072,
              description="Qwen2.5-7B: 28 layers, d=3584, GQA 28/4 heads, SwiGLU 18944, 128k context"),
    # source: Qwen/Qwen2.5-32B config.json (hidden 5120, 64 layers, 40 heads, 8 KV heads, intermediate 27648,
    # vocab 152064, max_position_embeddings 131072, tie_word_embeddings false)
    ModelSpec("qwen2.5-32b", 64, 5120, 40, 8, 128, 27648, 152064, 131072,
              description="Qwen2.5-32B: 64 layers, d=5120, GQA 40/8 heads, SwiGLU 27648, 128k context"),
    # source: Qwen/Qwen2.5-72B config.json (hidden 8192, 80 layers, 64 heads, 8 KV heads, intermediate 29568,
    # vocab 152064, max_position_embeddings 131072, tie_word_embeddings false)
    ModelSpec("qwen2.5-72b", 80, 8192, 64, 8, 128, 29568, 152064, 131072,
              description="Qwen2.5-72B: 80 layers, d=8192, GQA 64/8 heads, SwiGLU 29568, 128k context"),
    # source: Qwen/Qwen3-8B config.json (hidden 4096, 36 layers, 32 heads, 8 KV heads, head_dim 128,
    # intermediate 12288, vocab 151936, max_position_embeddings 40960, tie_word_embeddings false)
    ModelSpec("qwen3-8b", 36, 4096, 32, 8, 128, 12288, 151936, 40960,
              description="Qwen3-8B: 36 layers, d=4096, GQA 32/8 heads, SwiGLU 12288, 40k context"),
    # source: Qwen/Qwen3-32B config.json (hidden 5120, 64 layers, 64 heads of head_dim 128 (8192 wide, more
    # than hidden), 8 KV heads, intermediate 25600, vocab 151936, max_position_embeddings 40960,
    # tie_word_embeddings false): llm-d's "KV-cache wins" model
    ModelSpec("qwen3-32b", 64, 5120, 64, 8, 128, 25600, 151936, 40960,
              description="Qwen3-32B: 64 layers, d=5120, GQA 64/8 heads of 128, SwiGLU 25600, 40k context"),
    # Tiny Llama-style shapes for CPU profiling and tests (not published models): meant to be instantiated
    # with transformers' LlamaConfig and random weights by the profiler.
    ModelSpec("tiny", 4, 256, 4, 2, 64, 688, 4096, 2048,
              description="tiny Llama-style CPU shape: 4 layers, d=256, GQA 4/2 heads, SwiGLU 688"),
    ModelSpec("tiny-2l", 2, 256, 4, 2, 64, 688, 4096, 2048,
              description="tiny Llama-style CPU shape: 2 layers, d=256, GQA 4/2 heads, SwiGLU 688"),
    # tiny's MLP split into 8 experts of 344, top-2 (its active MLP is tiny's 688): a Mixtral-style CPU shape,
    # built with transformers' MixtralConfig
    ModelSpec("tiny-moe", 4, 256, 4, 2, 64, 344, 4096, 2048,
              moe=MoE(experts=8, experts_per_token=2, expert_size=344),
              description="tiny Mixtral-style CPU shape: 4 layers, d=256, GQA 4/2 heads, 8 SwiGLU experts of "
                          "344, top-2"),
]}


def model_in_working_folder(name: str) -> str:
    """A --model config.json path made absolute in the user's working folder; a catalogue name as it is."""
    if isinstance(name, str) and name.lower() not in MODELS and is_config_path(name):
        return in_working_folder(name)
    return name


def is_moe(name: str) -> bool:
    """Whether model `name` is a mixture of experts (False for a name it cannot find: the command using the
    model refuses that in its own words)."""
    try:
        return get_model(name).moe is not None
    except InputError:
        return False


def get_model(name: str) -> ModelSpec:
    """A catalogue shape by name, or the shape of a Hugging Face config.json given by its path
    (`simctl.catalogue.model_config`)."""
    if str(name).lower() not in MODELS and is_config_path(name):
        return ModelSpec(**read_model_config(name))
    try:
        return MODELS[str(name).lower()]
    except KeyError:
        raise InputError(f"unknown model {name!r}; known models: {', '.join(MODELS)}, or a config.json path"
                         ) from None
