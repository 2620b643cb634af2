"""`simctl validate --device / --dtype`: the real runs' device and dtype reach every real run, the twins are
sized on the KV budget those runs use, a cost model fitted on another device or in another dtype is refused
before anything runs (one line, exit 2 from the CLI), and a tiny validation runs on cuda where there is
one."""

from __future__ import annotations

import json
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import simctl_here

from simctl.common.errors import InputError
from simctl.costs.provenance import check_fitted_run
from simctl.traces.workload import Workload

pytestmark = pytest.mark.torch

SHIPPED_FIT = (Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu"
    / "cost_model.json")
H100 = "NVIDIA H100 80GB HBM3"


def one_line_error(res: subprocess.CompletedProcess[str], *words: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.count("\n") == 1 and res.stderr.startswith("simctl: error: "), res.stderr
    for w in words:
        assert w in res.stderr, (w, res.stderr)


# ---- which fitted model may price which real runs (no torch) -----------------------------------------------


@pytest.mark.parametrize("meta, device, name, dtype, match", [
    ({"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32"}, "cuda", None, "float32",
     r"profiled on AMD EPYC \(cpu\) and prices only that device, not --device cuda: give --device cpu"),
    ({"device": "cuda", "device_name": H100, "dtype": "bfloat16"}, "cpu", None, "bfloat16",
     "not --device cpu: give --device cuda"),
    ({"device": "cuda", "device_name": H100, "dtype": "bfloat16"}, "cuda:1", "NVIDIA A100-SXM4-80GB",
     "bfloat16", f"profiled on {H100}, but --device cuda:1 is NVIDIA A100-SXM4-80GB"),
    ({"device": "cuda", "device_name": H100, "dtype": "bfloat16"}, "cuda", H100, "float16",
     "profiled in bfloat16, not --dtype float16"),
    ({"device": "cpu", "dtype": "torch.float32"}, "cpu", "AMD EPYC", "bfloat16",
     "profiled in float32, not --dtype"),
])
def test_a_fit_of_another_device_or_dtype_is_refused(meta, device, name, dtype, match):
    with pytest.raises(InputError, match=match):
        check_fitted_run(meta, device, name, dtype)


@pytest.mark.parametrize("meta, device, name, dtype", [
    # CPUs: one
    ({"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32"}, "cpu", "Intel Xeon", "float32"),
    ({"device": "cuda:0", "device_name": H100, "dtype": "torch.bfloat16"}, "cuda", f" {H100.lower()}",
     "bfloat16"),
    # name not probed yet
    ({"device": "cuda", "device_name": H100, "dtype": "bfloat16"}, "cuda", None, "bfloat16"),
    ({"device": "cpu"}, "cpu", None, "float16"),  # a hand-made model that records no dtype
    ({}, "cpu", None, "float32"),
])
def test_a_fit_of_the_same_device_and_dtype_is_accepted(meta, device, name, dtype):
    check_fitted_run(meta, device, name, dtype)


# ---- the CLI's refusals: one line, exit 2, nothing run or written ------------------------------------------


def test_validate_on_cuda_with_the_shipped_cpu_fit_is_refused(tmp_path):
    """Refused before the device is probed or anything real runs, with or without a GPU."""
    out = tmp_path / "val"
    one_line_error(simctl_here("validate", "--policy", "vllm", "--device", "cuda", "--out", out),
                   "AMD EPYC (cpu)", "not --device cuda", "simctl profile --device cuda")
    assert not out.exists()


def test_validate_in_another_dtype_than_the_fit_is_refused(tmp_path):
    out = tmp_path / "val"
    one_line_error(simctl_here("validate", "--policy", "vllm", "--dtype", "bfloat16", "--out", out),
                   "profiled in float32, not --dtype bfloat16")
    assert not out.exists()


@pytest.mark.parametrize("option, value, words", [
    ("--device", "tpu", ("--device 'tpu' not supported",)),
    ("--dtype", "int8", ("--dtype 'int8' not supported",)),
])
def test_validate_refuses_an_unknown_device_or_dtype(tmp_path, option, value, words):
    out = tmp_path / "val"
    one_line_error(simctl_here("validate", "--policy", "vllm", option, value, "--out", out), *words)
    assert not out.exists()


def test_validate_on_cuda_without_cuda_is_one_line(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    fit = json.loads(SHIPPED_FIT.read_text(encoding="utf-8"))
    fit["meta"].update(device="cuda", device_name=H100)
    cost = tmp_path / "cost_model.json"
    cost.write_text(json.dumps(fit), encoding="utf-8")
    out = tmp_path / "val"
    one_line_error(simctl_here("validate", "--policy", "vllm", "--device", "cuda", "--cost", cost, "--out",
                               out), "--device cuda: cuda requested but not available")
    assert not out.exists()


# ---- the plumbing, with the real runs stubbed out ----------------------------------------------------------


class RealRunStarted(Exception):
    pass


def stub_cost(meta, overhead=1.5e-3):
    from simctl.costs.base import CostModel

    class StubCost(CostModel):
        """Tiny-2l on a CPU thread, roughly (as tests/test_validate.py's), for a capacity search in
        milliseconds."""

        def __init__(self) -> None:
            self.meta = meta

        def iteration_time(self, plan):
            return overhead + 3e-5 * plan.linear_tokens + 1.5e-7 * plan.decode_kv

        def breakdown(self, plan):
            return {"all": self.iteration_time(plan)}

    return StubCost()


@pytest.fixture
def real_runs(monkeypatch):
    """The keyword arguments of every real run validate_main starts (the first one stops it)."""
    import simctl.engine.real

    calls: list[dict] = []

    def no_real_run(**kw):
        calls.append(kw)
        raise RealRunStarted

    monkeypatch.setattr(simctl.engine.real, "real_main", no_real_run)
    return calls


ARGS = {"policies": ["vllm"], "workload": Workload(trace="sharegpt", qps=None, num_requests=100, scale=0.05),
        "loads": [0.5], "model": "tiny-2l"}


def test_cpu_float32_reaches_the_real_runs_as_before(real_runs, tmp_path):
    from simctl.engine.real import CPU_KV_BYTES
    from simctl.validation.validate import validate_main

    cost = stub_cost({"device": "cpu", "device_name": "AMD EPYC", "dtype": "float32", "threads": 1})
    with pytest.raises(RealRunStarted):
        validate_main(**ARGS, cost=cost, out=tmp_path / "val", device="cpu")
    kw = real_runs[0]
    assert (kw["device"], kw["dtype"], kw["threads"],
            kw["kv_budget_bytes"]) == ("cpu", "float32", 1, CPU_KV_BYTES)


def test_cuda_plumbing_and_sizing_on_the_probed_budget(real_runs, monkeypatch, tmp_path):
    """On cuda the device is probed once; every real run gets its KV budget, so the twins (and the simulated
    capacity) are sized as the real runs will be, here with the batch capped by a small budget. The dtype
    defaults to the fit's."""
    import simctl.engine.real
    from simctl.catalogue.models import get_model
    from simctl.engine.real import DeviceProbe
    from simctl.validation.twin import Setup, twin_summary
    from simctl.validation.validate import validate_main

    budget = 20 * 2**20  # tiny-2l in bfloat16: 1 KiB per token, slots of 416 tokens: 49 fit, not 100
    probed: list = []

    def probe(config):
        probed.append(config)
        return DeviceProbe("cuda", H100, budget)

    monkeypatch.setattr(simctl.engine.real, "probe_device", probe)
    cost = stub_cost({"device": "cuda", "device_name": H100, "dtype": "bfloat16", "threads": 4})
    said: list[str] = []
    with pytest.raises(RealRunStarted):
        validate_main(**ARGS, cost=cost, out=tmp_path / "val", device="cuda", log=said.append)
    assert len(probed) == 1 and (probed[0].device, probed[0].dtype) == ("cuda", "bfloat16")
    kw = real_runs[0]
    assert (kw["device"], kw["dtype"], kw["threads"],
            kw["kv_budget_bytes"]) == ("cuda", "bfloat16", 4, budget)
    assert any(H100 in line and "bfloat16" in line for line in said), said

    setup = Setup(workload=ARGS["workload"], model="tiny-2l", threads=4,
                  dtype="bfloat16", device="cuda", kv_budget_bytes=budget)
    capped = twin_summary(setup, "vllm", kw["workload"].qps)
    assert capped["max_batch_size"] < 128 and capped["kv_budget_bytes"] == budget
    roomy = twin_summary(replace(setup, kv_budget_bytes=1 << 40), "vllm", kw["workload"].qps)
    assert roomy["max_batch_size"] == 128 and roomy["kv_capacity_tokens"] > capped["kv_capacity_tokens"]
    # the real run's own sizing, from its config as real_main builds it: the twin's
    config = simctl.engine.real.RealConfig(policy="vllm", **{k: v for k, v in kw.items()
                                                      if k not in ("policy", "out")})
    requests = config.workload.requests()  # sharegpt, 100 requests, scale 0.05, seed 0 (ARGS)
    real = simctl.engine.real.size_run(config, requests, get_model("tiny-2l").kv_bytes_per_token(2),
                                config.kv_budget_bytes)
    assert (real.kv_capacity, real.max_batch_size) == (capped["kv_capacity_tokens"], capped["max_batch_size"])


def test_a_probed_gpu_other_than_the_fits_is_refused_before_any_real_run(real_runs, monkeypatch, tmp_path):
    import simctl.engine.real
    from simctl.engine.real import DeviceProbe
    from simctl.validation.validate import validate_main

    monkeypatch.setattr(simctl.engine.real, "probe_device",
                        lambda config: DeviceProbe("cuda", "NVIDIA A100", 1 << 30))
    cost = stub_cost({"device": "cuda", "device_name": H100, "dtype": "bfloat16"})
    with pytest.raises(InputError, match=f"profiled on {H100}, but --device cuda is NVIDIA A100"):
        validate_main(**ARGS, cost=cost, out=tmp_path / "val", device="cuda")
    assert not real_runs and not (tmp_path / "val").exists()


def test_the_probing_child_finds_the_device_as_a_run_does():
    """The child `probe_device` starts on cuda, here on the CPU: it builds the model and reports the
    device."""
    pytest.importorskip("torch")
    from simctl.engine.real import CPU_KV_BYTES, DeviceProbe, RealConfig, _run_worker
    from simctl.executor.runtime import cpu_name

    msg = _run_worker(RealConfig(model="tiny-2l", threads=1), probe=True)
    assert DeviceProbe(**msg["probe"]) == DeviceProbe("cpu", cpu_name(), CPU_KV_BYTES)


def test_a_real_run_sizes_its_kv_on_the_budget_given():
    """What validate hands every real run: the budget caps the slots and the batch, as the twin's sizing."""
    pytest.importorskip("torch")
    from simctl.engine.real import RealConfig, run_real
    from simctl.validation.twin import Setup, twin_summary

    budget = 2 * 2**20  # tiny-2l in float32: 2 KiB per token; 8 requests' slots of 352 tokens: 2 fit
    run = run_real(RealConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=50.0, num_requests=8,
                                                               scale=0.05),
                              model="tiny-2l", threads=1, kv_budget_bytes=budget))
    s = run.summary
    twin = twin_summary(Setup(workload=replace(ARGS["workload"], num_requests=8), model="tiny-2l", threads=1,
                              kv_budget_bytes=budget), "vllm", 50.0)
    assert s["kv_budget_bytes"] == budget and s["max_batch_size_capped"] and s["kv_slab_bytes"] <= budget
    assert (s["kv_slots"], s["max_batch_size"], s["kv_capacity_tokens"]) == (
        twin["max_batch_size"], twin["max_batch_size"], twin["kv_capacity_tokens"])
    assert s["completed"] == 8


# ---- on a GPU ----------------------------------------------------------------------------------------------


def _cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


@pytest.mark.skipif(not _cuda(), reason="needs a CUDA device")
def test_a_tiny_validation_on_cuda(tmp_path):
    """One policy, one load, one real run on the GPU against its twin: the device, its name and the dtype are
    recorded, the real run used the probed budget and the twin its sizing. The hand-made cost model charges
    10 ms an iteration, more than an eager tiny-2l step takes on a GPU (a few ms of kernel launches), and the
    load is a quarter of the simulated capacity (which the TTFT SLO makes exist with 100 requests): the checks
    are of the plumbing, not of the GPU's speed."""
    import torch

    from simctl.studies.capacity import SLO
    from simctl.validation.validate import validate_main

    name = torch.cuda.get_device_name(0)
    cost = stub_cost({"device": "cuda", "device_name": name, "dtype": "bfloat16", "threads": 2},
                     overhead=0.01)
    out = tmp_path / "val"
    report = validate_main(["sarathi"], Workload(trace="sharegpt", qps=None, num_requests=100, scale=0.02),
                           [0.25], cost=cost, out=out, model="tiny-2l", slo=SLO({"p50_ttft": 0.04}),
                           device="cuda")
    c = json.loads((out / "validation.json").read_text())["config"]
    assert (c["device"], c["device_name"], c["dtype"]) == ("cuda", name, "bfloat16")
    assert name in (out / "validation.md").read_text()
    run = out / "runs" / "sarathi" / "load_0.25"
    real = json.loads((run / "real" / "summary.json").read_text())
    assert (real["device"], real["device_name"], real["dtype"]) == ("cuda", name, "bfloat16")
    assert real["kv_budget_bytes"] == c["kv_budget_bytes"] > 0
    sim = json.loads((run / "sim" / "summary.json").read_text())
    for k in ("kv_capacity_tokens", "max_seq_len", "max_batch_size"):
        assert sim[k] == real[k], k
    row = report.rows[0]
    assert row["identical_requests"] and row["real_completed"] > 0
    assert math.isfinite(row["ttft_p50_real"]) and math.isfinite(row["ttft_p50_err_pct"])
    assert report.evidence[0]["replay_matched"] == report.evidence[0]["iterations"]
