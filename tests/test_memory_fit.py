"""A model that does not fit the device's memory is refused, with the numbers, before anything is built
(issue 35, item 1): `real` started building a 276 GB float32 llama-2-70b on a 23 GB machine until the kernel
killed it. Every command that builds a model goes through `executor.memory.check_fits`; here the machine's
memory is pinned, and anything that would start a child or build a model fails the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from simctl.catalogue.models import get_model
from simctl.cli import main
from simctl.common.errors import InputError
from simctl.executor.memory import available_bytes, check_fits, memory_need
from simctl.traces.workload import Workload

pytestmark = pytest.mark.unit

GB = 10**9


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    return int(e.value.code or 0), capsys.readouterr().err


@pytest.fixture
def machine_of_21_gb(monkeypatch: pytest.MonkeyPatch) -> None:
    """21 GB available on every device, and no child, worker or model may be started."""
    import simctl.engine.real
    import simctl.executor.model
    import simctl.profiler.profile

    def started(*args: object, **kw: object) -> None:
        raise AssertionError("a model was built or a child started")

    monkeypatch.setattr("simctl.executor.memory.available_bytes", lambda device: 21 * GB)
    monkeypatch.setattr(simctl.engine.real, "_run_worker", started)
    monkeypatch.setattr(simctl.profiler.profile, "run_worker", started)
    monkeypatch.setattr(simctl.executor.model, "build_model", started)


def refused_with_numbers(code: int, err: str, model: str = "llama-2-70b") -> None:
    assert code == 2 and err.count("\n") == 1, (code, err)
    for words in (f"simctl: error: {model} in float32 needs", "weights", "KV", "activations",
                  "this machine has 21 GB available"):
        assert words in err, (words, err)


@pytest.mark.parametrize(("model", "args"), [
    ("llama-2-70b", ("real", "--model", "llama-2-70b", "--num-requests", "5")),
    ("llama-2-70b", ("query-set", "--real", "--real-model", "llama-2-70b")),
    ("llama-2-13b", ("prefill-bench", "--real", "--model", "llama-2-13b", "--gpu", "h100", "--prompts", "8",
                     "--batch-size", "4")),
])
def test_a_model_larger_than_the_machine_is_refused_before_anything_starts(
        machine_of_21_gb: None, capsys: pytest.CaptureFixture[str], model: str, args: tuple[str, ...]
) -> None:
    refused_with_numbers(*cli(capsys, *args), model)


def test_the_profile_is_refused_before_its_child_starts(machine_of_21_gb: None, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    code, err = cli(capsys, "profile", "--model", "llama-2-13b", "--quick", "--out", tmp_path / "p")
    refused_with_numbers(code, err, "llama-2-13b")
    assert not (tmp_path / "p").exists()


def test_validate_probes_memory_before_building_on_cuda(machine_of_21_gb: None) -> None:
    """validate's probe builds the model in a child on cuda: the check comes first."""
    from simctl.engine.real import RealConfig, probe_device

    with pytest.raises(InputError, match=r"llama-2-70b in float32 needs .* but cuda has 21 GB available"):
        probe_device(RealConfig(workload=Workload(trace="sharegpt", qps=1.0, num_requests=5, scale=0.1),
                                model="llama-2-70b", device="cuda"))


def test_the_need_is_weights_kv_and_activations() -> None:
    spec = get_model("llama-2-7b")
    need = memory_need(spec, "float32", kv_tokens=1000, step_tokens=10)
    assert need.weights == spec.total_params * 4
    assert need.kv == 1000 * spec.kv_bytes_per_token(4)
    assert 0 < need.activations < 10 * 10**6  # ten tokens through one layer, and their logits
    assert need.total == need.weights + need.kv + need.activations
    assert memory_need(spec, "bfloat16", 1000, 10).weights == need.weights // 2


def test_two_instances_need_two_models() -> None:
    spec = get_model("tiny")
    one = memory_need(spec, "float32", 100, 10).total
    check_fits(spec, "float32", 100, 10, "cpu", available=one)
    with pytest.raises(InputError, match="x 2 instances"):
        check_fits(spec, "float32", 100, 10, "cpu", instances=2, available=one)


def test_a_model_that_fits_passes_and_the_machine_is_asked() -> None:
    has = available_bytes("cpu")
    assert has is not None and has > 0
    check_fits(get_model("tiny"), "float32", 1000, 100, "cpu")


def test_a_real_run_on_a_probed_cuda_budget_asks_the_device_nothing_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # validate probes the device once (a child builds the model there); each of its real runs then carries
    # that budget, and must not start another CUDA child just to ask for the free memory
    from simctl.engine.real import check_memory
    from simctl.engine.setup import RealConfig

    def asked(device: str) -> int:
        raise AssertionError(f"the device {device} was asked again")

    monkeypatch.setattr("simctl.executor.memory.available_bytes", asked)
    workload = Workload(trace="sharegpt", qps=1.0, num_requests=20, scale=0.05)
    config = RealConfig(policy="vllm", workload=workload, model="tiny", device="cuda",
                        kv_budget_bytes=1 << 30)
    check_memory(config, config.workload.requests())
    with pytest.raises(AssertionError, match="asked again"):  # without a probed budget it does ask
        check_memory(RealConfig(policy="vllm", workload=config.workload, model="tiny", device="cuda"),
                     config.workload.requests())
