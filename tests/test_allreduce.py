"""The roofline's all-reduces as vLLM runs them (`costs/allreduce.py`): the custom one-/two-shot kernels below
their size limit where vLLM takes them, NCCL's ring elsewhere, by hand."""

from __future__ import annotations

import pytest
from test_roofline import decode_plan

from simctl.common.errors import InputError
from simctl.costs.allreduce import CUSTOM_LATENCY_S as LAT
from simctl.costs.roofline import Roofline

HIDDEN_BYTES = 8192 * 2  # llama-2-70b: hidden 8192, bf16
CALLS = 2 * 80  # two all-reduces per layer, 80 layers


def priced(gpu: str, tp: int, tokens: int, mode: str) -> float:
    """The all-reduce term of a decode step of `tokens` rows of llama-2-70b on `tp` x `gpu`."""
    rf = Roofline("llama-2-70b", gpu, tp=tp, allreduce=mode)
    return rf.breakdown(decode_plan(tokens, 100))["allreduce"]


def test_a_one_shot_reads_every_peers_input_after_a_fixed_latency():
    # H100, TP 4, 8 tokens: 128 KiB under 512 KiB, one-shot: 6 us + 3 x 128 KiB over 450 GB/s x 0.863 (tp
    # 4's measured NCCL efficiency), per call
    link = 450e9 * 0.863
    assert priced("h100", 4, 8, "vllm") == pytest.approx(CALLS * (LAT + 3 * 8 * HIDDEN_BYTES / link),
                                                         rel=1e-12)
    # TP 2 is one-shot up to the limit: 256 tokens = 4 MiB, 1 peer, tp 2's efficiency 0.726
    assert priced("h100", 2, 256, "vllm") == pytest.approx(
        CALLS * (LAT + 256 * HIDDEN_BYTES / (450e9 * 0.726)), rel=1e-12)


def test_a_two_shot_above_the_one_shot_size_pays_two_stages():
    # H100, TP 4, 64 tokens: 1 MiB, at least 512 KiB: 2 x 6 us + 2 x 3/4 x 1 MiB over the link, per call
    link = 450e9 * 0.863
    assert priced("h100", 4, 64, "vllm") == pytest.approx(
        CALLS * (2 * LAT + 2 * 3 / 4 * 64 * HIDDEN_BYTES / link), rel=1e-12)


def test_nccl_prices_from_the_size_limit_and_wherever_vllm_does_not_take_its_own():
    # 512 tokens = 8 MiB: not under max_size; Hopper at 8 GPUs: limit 256 KiB, 16 tokens is 256 KiB;
    # 4 GPUs on PCIe (not all connected by NVLink): NCCL for every size
    for gpu, tp, tokens in (("h100", 4, 512), ("h100", 8, 16), ("a6000", 4, 1)):
        assert priced(gpu, tp, tokens, "vllm") == priced(gpu, tp, tokens, "nccl")
    assert priced("h100", 8, 15, "vllm") < priced("h100", 8, 15, "nccl")
    assert priced("a6000", 2, 1, "vllm") < priced("a6000", 2, 1, "nccl")  # 2 GPUs: custom over PCIe too


def test_the_custom_path_is_cheaper_where_it_runs_and_the_mode_is_recorded():
    assert priced("a100-80gb", 8, 8, "vllm") < priced("a100-80gb", 8, 8, "nccl")  # no Hopper cap at 8 on A100
    assert Roofline("llama-2-70b", "h100", tp=4, allreduce="vllm").assumptions()["allreduce"] == "vllm"
    # vLLM's is the default, recorded wherever TP prices all-reduces
    assert Roofline("llama-2-70b", "h100", tp=4).assumptions()["allreduce"] == "vllm"
    assert "allreduce" not in Roofline("llama-2-70b", "h100").assumptions()
    with pytest.raises(InputError, match="--allreduce must be one of nccl, vllm"):
        Roofline("llama-2-70b", "h100", tp=4, allreduce="ring")


def test_a_run_asks_for_it_and_a_fit_refuses_it(tmp_path):
    from simctl.sim.run import RunConfig, run
    from simctl.traces.workload import Workload

    config = RunConfig(policy="vllm-v1", model="llama-2-70b", gpu="h100", tp=4, allreduce="vllm",
                       workload=Workload(num_requests=10))
    summary = run(config).summary
    assert summary["allreduce"] == "vllm" and summary["cost_assumptions"]["allreduce"] == "vllm"
    with pytest.raises(InputError, match="--allreduce vllm prices TP in the roofline"):
        run(RunConfig(policy="vllm-v1", model="tiny", gpu="cpu", allreduce="vllm",
                      workload=Workload(num_requests=10)))
