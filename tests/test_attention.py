"""The executor's attention: kernels chosen explicitly (`simctl.executor.config.ExecutorConfig.attention`),
grouped-query calls folded into the query axis rather than `enable_gqa` or repeated K/V heads, and the kernels
recorded.

Exactness: `sdpa` against a float64 reference with repeated K/V heads on random shapes (GQA 4/2 as `tiny`,
and others), and whole iterations (decode rows with holes and mixed contexts, chunks on cached context, padded
and bin-packed batches) against transformers' own SDPA model under every attention setting this device has.
The CUDA tests skip without a GPU."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from torch.nn.attention import sdpa_kernel

from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.executor import ragged_attention
from simctl.executor.config import ATTENTION, ExecutorConfig, check_same
from simctl.executor.model import build_model, reference_model
from simctl.executor.ragged import RaggedExecutor, Segment, attention_kernels
from simctl.executor.ragged_attention import AttentionLayout, sdpa

pytestmark = pytest.mark.torch

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")
CPU_SETTINGS = [a for a in ATTENTION if a != "efficient"]


def reference(q, k, v, mask, is_causal, scale):
    """Attention in float64 with each K/V head repeated for its G query heads (head h reads K/V head h //
    G)."""
    G = q.shape[1] // k.shape[1]
    k, v = (t.double().repeat_interleave(G, 1) for t in (k, v))
    s = q.double() @ k.transpose(-1, -2) * scale
    if is_causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=s.device).triu(1), -math.inf)
    if mask is not None:
        s = s + mask.double()
    return torch.softmax(s, -1) @ v


def random_case(g: torch.Generator, B: int, KVH: int, G: int, L: int, K: int, device: str = "cpu",
                dtype: torch.dtype = torch.float32, masked: bool = True):
    D = 16
    q, k, v = (torch.randn(B, h, n, D, generator=g).to(device, dtype)
               for h, n in ((KVH * G, L), (KVH, K), (KVH, K)))
    if not masked:
        return q, k, v, None
    blocked = torch.rand(B, 1, L, K, generator=g) < 0.4
    blocked[..., 0] = False  # every query sees a key
    mask = torch.zeros(B, 1, L, K).masked_fill_(blocked, -math.inf).to(device, dtype)
    return q, k, v, mask


def fold(mask: torch.Tensor, G: int) -> torch.Tensor:
    return mask if mask.shape[-2] == 1 else mask.repeat(1, 1, G, 1)


@pytest.mark.parametrize("setting", ["auto", "math"])
@pytest.mark.parametrize("case", range(12))
def test_folded_and_per_group_attention_match_repeated_heads(setting, case):
    g = torch.Generator().manual_seed(case)
    B, KVH, G = (int(x) for x in torch.randint(1, 4, (3,), generator=g))
    G = (1, 2, 4)[G - 1]
    L = int(torch.randint(1, 9, (1,), generator=g))
    K = L + int(torch.randint(0, 20, (1,), generator=g))
    scale = 0.25
    backends = ExecutorConfig(setting).backends("cpu")
    chosen = tuple(ragged_attention.BACKENDS[b] for b in backends)
    q, k, v, mask = random_case(g, B, KVH, G, L, K)
    with torch.inference_mode(), sdpa_kernel(list(chosen)):
        got = sdpa(q, k, v, fold(mask, G), False, scale, AttentionLayout(chosen, G, True), "x")
        assert (got.double() - reference(q, k, v, mask, False, scale)).abs().max() < 1e-5
        decode = mask[:, :, :1]  # one query row: the mask broadcasts over the folded heads
        got = sdpa(q[:, :, :1], k, v, decode, False, scale, AttentionLayout(chosen, G, True), "x")
        assert (got.double() - reference(q[:, :, :1], k, v, decode, False, scale)).abs().max() < 1e-5
        kc, vc = k[:, :, :L], v[:, :, :L]
        expect = reference(q, kc, vc, None, True, scale)
        for gqa_causal in (True, False):  # one enable_gqa call, or one call per head of a group
            got = sdpa(q, kc, vc, None, True, scale, AttentionLayout(chosen, G, gqa_causal), "x")
            assert (got.double() - expect).abs().max() < 1e-5
    # not vacuous: the heads of a group read their own queries, and a fold that ignored the mask is far off
    if G > 1 and mask[..., 1:].isinf().any():
        with torch.inference_mode():
            unmasked = sdpa(q, k, v, None, False, scale, AttentionLayout(chosen, G, True), "x")
        assert (unmasked.double() - reference(q, k, v, mask, False, scale)).abs().max() > 1e-3


@pytest.fixture(scope="module")
def models():
    spec = get_model("tiny")  # GQA 4/2
    model = build_model(spec, "cpu", "float32", seed=0)
    return spec, model, reference_model(model)


def ref_last(ref, tokens):
    with torch.inference_mode():
        return ref(input_ids=tokens[None], use_cache=False).logits[0, -1]


@pytest.mark.parametrize("setting", CPU_SETTINGS)
def test_every_kind_of_iteration_matches_the_reference_under_each_setting(models, setting):
    spec, model, ref = models
    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, spec.vocab_size, (n,), generator=g) for n in (9, 40, 2, 23, 61)]
    expect = torch.stack([ref_last(ref, p) for p in prompts])
    ex = RaggedExecutor(model, 8, 96, ExecutorConfig(setting))
    # decode rows of mixed contexts in slots 0, 2, 3, 5 (holes at 1 and 4), beside a chunk on 30 cached tokens
    slots = [0, 2, 3, 5]
    ex.run([Segment(s, p[:-1]) for s, p in zip(slots, prompts[:4])]
           + [Segment(6, prompts[4][:30], sample=False)])
    out = ex.run([Segment(s, p[-1:], len(p) - 1) for s, p in zip(slots, prompts[:4])]
                 + [Segment(6, prompts[4][30:], 30)])
    assert (out - expect).abs().max() < 1e-5
    # a padded batch under a mask (rows of different lengths over 70 KV columns), then bin-packed rows
    ex.clear()
    pre = ex.run_padded([Segment(i, p[:-1]) for i, p in enumerate(prompts)], length=64, dense=True)
    assert pre.shape[0] == len(prompts)
    out = ex.run_padded([Segment(i, p[-1:], len(p) - 1) for i, p in enumerate(prompts)], kv_len=70)
    assert (out - expect).abs().max() < 1e-5
    for dense in (True, False):
        out = ex.run_binpacked([[Segment(0, prompts[0]), Segment(1, prompts[2]), Segment(2, prompts[3])],
                                [Segment(3, prompts[1])]], 40, dense=dense)
        assert (out - expect[[0, 2, 3, 1]]).abs().max() < 1e-5


def test_kernels_of_every_kind_are_recorded(models):
    _, model, _ = models
    kinds = {"decode", "decode_masked", "prefill_causal", "prefill_masked", "padded", "padded_causal",
             "padded_masked", "binpacked_causal", "binpacked_masked"}
    auto = attention_kernels(model)
    assert set(auto) == kinds
    assert auto["decode_masked"] == "flash (folded)" and auto["prefill_causal"] == "flash (enable_gqa)"
    assert set(attention_kernels(model,
                                 ExecutorConfig("math")).values()) == {"math (folded)", "math (enable_gqa)"}
    assert ragged_attention._kernels_seen is None  # recording stops with the probe


def test_a_setting_without_a_kernel_for_a_kind_is_refused_naming_it(models, monkeypatch):
    _, model, _ = models
    real_sdpa = ragged_attention.F.scaled_dot_product_attention

    def no_masks(q, k, v, attn_mask=None, **kw):
        if attn_mask is not None:
            raise RuntimeError("No available kernel. Aborting execution.")
        return real_sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(ragged_attention.F, "scaled_dot_product_attention", no_masks)
    with pytest.raises(InputError,
                       match=r"--attention flash \(flash\) has no kernel for decode_masked attention "
                                         r"on cpu in float32: No available kernel"):
        attention_kernels(model, ExecutorConfig("flash"))
    assert ragged_attention._kernels_seen is None


def test_executor_config_values_and_records():
    with pytest.raises(InputError, match="--attention 'cudnn' unknown; choose one of auto, flash, efficient"):
        ExecutorConfig("cudnn").validate()
    with pytest.raises(InputError, match="--attention efficient: .* no kernel on cpu"):
        ExecutorConfig("efficient").validate("cpu")
    with pytest.raises(InputError, match="--cuda-graphs needs a CUDA device"):
        ExecutorConfig(eager=False).validate()
    ExecutorConfig(eager=False).validate("cuda:0")
    assert ExecutorConfig(eager=False).record("cuda")["cuda_graphs"] == {"max_rows": 512, "kv_block": 256}
    assert ExecutorConfig().backends("cuda:1") == ("flash", "efficient")  # never cuDNN by default
    assert "cudnn" in ExecutorConfig("any").backends("cuda")
    assert ExecutorConfig().record("cpu") == {"attention": "auto", "eager": True,
                                              "attention_backends": ["flash", "math"]}
    assert ExecutorConfig.of_record({}) == ExecutorConfig("any")  # recorded before the configuration existed
    assert (ExecutorConfig.of_record({"executor_config": ExecutorConfig("math").record("cpu")})
            == ExecutorConfig("math"))


def test_a_fit_refuses_a_run_made_with_other_kernels():
    legacy_cpu, legacy_cuda = {"device": "cpu"}, {"device": "cuda"}
    run = {"device": "cpu", "executor_config": ExecutorConfig().record("cpu")}
    check_same(legacy_cpu, run)  # before the configuration existed a CPU ran the same kernels as auto does
    math_run = {"device": "cpu", "executor_config": ExecutorConfig("math").record("cpu")}
    with pytest.raises(InputError, match=r"profiled with --attention any \(flash, math\), the real run uses "
                                         r"--attention math \(math\)"):
        check_same(legacy_cpu, math_run)
    cuda_run = {"device": "cuda:0", "executor_config": ExecutorConfig().record("cuda")}
    with pytest.raises(InputError, match="cudnn"):  # on CUDA, the old executor let torch pick cuDNN
        check_same(legacy_cuda, cuda_run)
    check_same({"device": "cuda", "executor_config": ExecutorConfig().record("cuda")}, cuda_run)


# ---- CUDA only ---------------------------------------------------------------------------------------------


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("setting", ["auto", "efficient", "flash"])
def test_cuda_folded_attention_matches_repeated_heads(dtype, setting):
    g = torch.Generator().manual_seed(0)
    chosen = tuple(ragged_attention.BACKENDS[b] for b in ExecutorConfig(setting).backends("cuda"))
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    backends = ExecutorConfig(setting).backends("cuda")
    attn = ragged_attention.attention_layout(backends, torch.device("cuda"), dtype, 8, 2, 16)
    q, k, v, mask = random_case(g, 3, 2, 4, 5, 37, "cuda", dtype)
    with torch.inference_mode(), sdpa_kernel(list(chosen)):
        try:
            got = sdpa(q[:, :, :1], k, v, mask[:, :, :1], False, 0.125, attn, "x")  # masked decode rows
        except RuntimeError:
            assert setting == "flash"  # flash takes no mask: refused, never silently another kernel
        else:
            assert (got.double() - reference(q[:, :, :1], k, v, mask[:, :, :1], False,
                                             0.125)).abs().max() < tol
        kc, vc = k[:, :, :5], v[:, :, :5]
        try:
            got = sdpa(q, kc, vc, None, True, 0.125, attn, "x")
        except RuntimeError:
            assert setting == "flash" and dtype == torch.float32  # flash needs 16-bit floats
        else:
            assert (got.double() - reference(q, kc, vc, None, True, 0.125)).abs().max() < tol


@needs_cuda
def test_cuda_auto_never_runs_cudnn_and_masked_decodes_have_a_kernel():
    """simctl issue 11: cuDNN re-planned for every new KV length, so a served decode step cost 3-4x the same
    step at one length; `auto` never runs it (the timing itself, growing against fixed contexts, is
    bench/attention_kernels.py's)."""
    model = build_model(get_model("tiny"), "cuda", "bfloat16", seed=0)
    kernels = attention_kernels(model)
    assert not any(k.startswith("cudnn") for k in kernels.values()), kernels
    assert (kernels["decode_masked"] == "efficient (folded)"
            and kernels["prefill_causal"] == "flash (enable_gqa)")
    fp32 = attention_kernels(build_model(get_model("tiny"), "cuda", "float32", seed=0))
    # no fp32 flash: efficient, per group where it takes no GQA
    assert fp32["prefill_causal"].startswith("efficient")


# ---- one executor configuration for the profile, its fit and the real runs it prices -----------------------


SHIPPED_CPU_PROFILE = Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu"
SIMCTL = Path(sys.executable).parent / "simctl"


def simctl_error(*args: str, cwd: Path) -> str:
    """The one line a refused command writes on stderr (exit 2)."""
    res = subprocess.run([str(SIMCTL), *args], capture_output=True, text=True, cwd=cwd, timeout=300,
                         check=False)
    assert (res.returncode == 2 and res.stderr.count("\n") == 1
            and res.stderr.startswith("simctl: error: ")), res
    return res.stderr


def test_a_fit_records_its_profiles_executor_and_the_twin_refuses_another(tmp_path):
    from simctl.costs.fitted import Fitted
    from simctl.profiler.fit import fit_profile
    from simctl.validation.twin import Setup, check_executor, twin_summary

    profile = tmp_path / "cpu"
    shutil.copytree(SHIPPED_CPU_PROFILE, profile)
    assert "executor_config" not in json.loads((profile / "meta.json").read_text())  # made before it existed
    report = fit_profile(profile, plot=False)
    fitted = Fitted.load(report.cost_model_path)
    assert fitted.meta["executor_config"] == {"attention": "any", "eager": True,
                                              "attention_backends": ["flash", "math"]}
    check_executor(fitted, twin_summary(Setup(), "vllm", 1.0))  # auto runs the kernels `any` ran on a CPU
    with pytest.raises(InputError,
                       match="profiled with --attention any .* the real run uses --attention math"):
        check_executor(fitted, twin_summary(Setup(attention="math"), "vllm", 1.0))


def test_validate_refuses_real_runs_with_other_kernels_than_the_fits(tmp_path):
    from simctl.validation.validate import validate_main

    with pytest.raises(InputError, match="--attention math"):
        validate_main(["vllm"], cost=SHIPPED_CPU_PROFILE / "cost_model.json", out=tmp_path / "v",
                      attention="math")
    assert not (tmp_path / "v").exists()
    err = simctl_error("validate", "--policy", "vllm", "--attention", "math", "--out", "v", cwd=tmp_path)
    assert "profiled with --attention any (flash, math)" in err and not (tmp_path / "v").exists()


@pytest.mark.parametrize("command, words", [
    (("real", "--attention", "cudnn"),
     "--attention 'cudnn' unknown; choose one of auto, flash, efficient, math, any"),
    (("profile", "--out", "p", "--attention", "efficient"),
     "--attention efficient: the memory-efficient kernel"),
    (("validate", "--attention", "fast"), "--attention 'fast' unknown"),
])
def test_bad_attention_is_one_line(tmp_path, command, words):
    assert words in simctl_error(*command, cwd=tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_help_teaches_the_attention_choices():
    res = subprocess.run([str(SIMCTL), "real", "--help"], capture_output=True, text=True, timeout=60,
                         check=True)
    flat = " ".join(res.stdout.split())
    assert "never cuDNN" in flat and "re-plans for every new KV length" in flat and "[default: auto]" in flat
