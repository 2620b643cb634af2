from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from hypothesis import settings

from simctl.costs.base import CostModel
from simctl.policies.plan import BatchPlan
from simctl.traces.request import Request


class AffineCost(CostModel):
    """A small hand-checkable cost model: fixed overhead + per linear token + per attention unit + per KV
    read."""

    def __init__(self, overhead: float = 0.005, per_token: float = 1e-4, per_attn: float = 1e-8,
                 per_kv: float = 1e-6) -> None:
        self.overhead, self.per_token, self.per_attn, self.per_kv = overhead, per_token, per_attn, per_kv

    def iteration_time(self, plan: BatchPlan) -> float:
        attn = sum(q * (c + q / 2) for q, c in zip(plan.prefill_q, plan.prefill_c))
        return (self.overhead + self.per_token * plan.linear_tokens + self.per_attn * attn
                + self.per_kv * plan.decode_kv)


class TinyCost(AffineCost):
    """A hand-made cost model of tiny-2l on one CPU thread (roughly what the profile of `tiny` gives, halved
    for half the layers), for validations: they check the pipeline, not a fit (and so do not depend on the
    fitted model's file format)."""

    def __init__(self) -> None:
        super().__init__(overhead=1.5e-3, per_token=3e-5, per_attn=1.5e-8, per_kv=1.5e-7)
        self.meta = {"device": "cpu", "threads": 1}

    def breakdown(self, plan: BatchPlan) -> dict[str, float]:
        return {"all": self.iteration_time(plan)}


def random_requests(n: int, qps: float, seed: int, max_prompt: int = 2000, max_output: int = 300
                    ) -> list[Request]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / qps, n))
    prompts = rng.integers(1, max_prompt + 1, n)
    outputs = rng.integers(1, max_output + 1, n)
    return [Request(i, float(a), int(p), int(o))
            for i, (a, p, o) in enumerate(zip(arrivals, prompts, outputs))]


@pytest.fixture
def affine_cost() -> AffineCost:
    return AffineCost()


def simctl_here(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`simctl ARGS` run in this process through the command line's entry point (its exit code, stdout and
    stderr as a child's would be): for what a command says, bad input above all, which it refuses in-process;
    the console script's own boundary is crossed by tests/test_cli.py and the interruption tests."""
    from simctl.cli import main

    out, err, before = io.StringIO(), io.StringIO(), Path.cwd()
    code = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main([str(a) for a in args])
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        os.chdir(before)
    return subprocess.CompletedProcess(["simctl", *map(str, args)], code, out.getvalue(), err.getvalue())


# ---- other processes' states, read from /proc: a test waits on one, never for a fixed time ---------------

def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first); None once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except FileNotFoundError:
        return None


def alive(pid: int) -> bool:
    stat = _stat(pid)
    return stat is not None and stat[0] != "Z"


def cpu_seconds(pid: int) -> float:
    """CPU seconds the process has used (utime + stime), 0 once it is gone."""
    stat = _stat(pid)
    return (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK") if stat else 0.0


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 60.0) -> None:
    """Poll `condition` until it holds (a state of another process, not a time: no fixed sleep); the timeout
    only turns a hang into a failure."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.02)


# ---- the real engine's tests (test_engine, test_disagg): the tiny-2l model, one thread ---------------------

ENGINE_MODEL = "tiny-2l"
ENGINE_SEED = 0


@pytest.fixture(scope="module")
def one_torch_thread():
    """One thread: no OpenMP team spinning in the test process (it has no OMP_WAIT_POLICY=PASSIVE)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def model():
    from simctl.catalogue.models import get_model
    from simctl.executor.model import build_model

    return build_model(get_model(ENGINE_MODEL), "cpu", "float32", ENGINE_SEED)


@pytest.fixture(scope="module")
def alone(model):
    """Greedy tokens of a request run by itself (cached by prompt length, output length and id)."""
    from simctl.catalogue.models import get_model
    from simctl.engine.serve import generate_alone, prompt_ids
    from simctl.executor.ragged import RaggedExecutor

    vocab = get_model(ENGINE_MODEL).vocab_size
    cache: dict[tuple[int, int, int], list[int]] = {}
    executor = RaggedExecutor(model, 1, 256)

    def tokens(r: Request) -> list[int]:
        key = (r.id, r.prompt_tokens, r.output_tokens)
        if key not in cache:
            cache[key] = generate_alone(executor, prompt_ids(r.id, r.prompt_tokens, vocab, ENGINE_SEED),
                                        r.output_tokens)
        return cache[key]

    return tokens


@pytest.fixture(scope="session")
def tiny_profile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The test grid's profile of tiny-2l on one thread (`simctl.profiler.profile.profile`): profiled once for
    the tests that read it (a profiling child costs 10-30 s here)."""
    from simctl.profiler.profile import profile

    return profile("tiny-2l", "cpu", "float32", 1, True, tmp_path_factory.mktemp("profile") / "prof",
                   progress=False, grid="test")


@pytest.fixture(scope="session")
def validated(tmp_path_factory: pytest.TempPathFactory):
    """A tiny validation (`simctl.validation.validate.validate_main`: sarathi on tiny-2l at half the simulated
    capacity, two real runs, priced by TinyCost), run once from a working folder of its own with a relative
    out, as a user runs it: (its report, the out folder). test_validate checks its files and values,
    test_working_folder that its real runs were read back from that folder."""
    from simctl.studies.capacity import SLO
    from simctl.traces.workload import Workload
    from simctl.validation.validate import validate_main

    work = tmp_path_factory.mktemp("work")
    # 100 requests (the fewest a capacity search takes); a tight TTFT limit keeps the simulated capacity, and
    # so the real runs, short
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(work)
        workload = Workload(trace="sharegpt", qps=None, num_requests=100, scale=0.02)
        report = validate_main(["sarathi"], workload, [0.5], cost=TinyCost(), out="val", model="tiny-2l",
                               threads=1, slo=SLO({"p50_ttft": 0.004}), repeats=2)
    return report, work / "val"


# ---- one vLLM engine for the tests that serve on vLLM's defaults (test_vllm_engine, test_vllm_validate) ----

VLLM_MODEL = "tiny"


@pytest.fixture(scope="session")
def vllm_server():
    """The installed vLLM serving `tiny` with its default settings (max_model_len 2048, seed 0), started once
    for the session: a start costs 30-40 s here, and `serve` resets the prefix cache between runs."""
    pytest.importorskip("vllm")
    from simctl.engine.vllm_real import VLLMServer
    from simctl.executor.vllm_runtime import VLLMEngineArgs

    with VLLMServer(VLLM_MODEL, VLLMEngineArgs(max_model_len=2048)) as server:
        yield server


@contextlib.contextmanager
def sharing(server):
    """Within it, product code that starts `simctl.engine.vllm_real.VLLMServer` on the shared engine's model
    and engine arguments gets the running `server` (left running on exit); any other engine fails the test."""
    from simctl.engine import vllm_real

    @contextlib.contextmanager
    def borrowed(model: str, args, device: str = "cpu"):
        assert (model, args, device) == (VLLM_MODEL, server.args, server.device), \
            "not the shared engine: start one of its own"
        yield server

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_real, "VLLMServer", borrowed)
        yield


# Test tiers. A module that runs a torch model, the installed vLLM or simctl as a child process says so with
# `pytestmark`; every other test is `unit`, and a hypothesis test is also `property`. `make test-fast` runs
# what needs none of the three.
TIERS = {
    "unit": "pure Python: policies, simulator, cost models, files (no torch model, no vLLM, no child simctl)",
    "property": "hypothesis over random traces or shapes (also unit unless its module says otherwise)",
    "cli": "runs simctl as a child process, as a user would",
    "torch": "runs simctl's own engine or profiler on a torch model",
    "vllm": "runs the installed vLLM (skipped without it)",
}
HEAVY = ("cli", "torch", "vllm")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in TIERS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.addinivalue_line("markers", "slow: a real engine's check of a minute or more here (a vLLM step "
                            "profile, vLLM started by a child simctl); runs with --thorough, as CI runs it")
    if config.getoption("thorough"):
        settings.load_profile("thorough")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--thorough", action="store_true",
                     help="the costliest property tests with their full examples and the slow real-engine "
                     "checks (CI: `make test PYTEST_ARGS=--thorough`)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    thorough = config.getoption("thorough")
    slow = None if thorough else pytest.mark.skip(reason="slow: runs with --thorough, as in CI")
    for item in items:
        if slow and item.get_closest_marker("slow"):
            item.add_marker(slow)
        if getattr(getattr(item, "function", None), "hypothesis", None) is not None:
            item.add_marker(pytest.mark.property)
        if not any(item.get_closest_marker(tier) for tier in HEAVY):
            item.add_marker(pytest.mark.unit)


# Hypothesis profiles: the default one runs the costliest property tests (several whole simulations an
# example) with fewer examples, so that `make test` keeps to its minutes; `thorough` (`--thorough`) runs them
# with their full count.
settings.register_profile("thorough")


def examples(default: int, thorough: int) -> int:
    """A property test's examples under the hypothesis profile loaded: `thorough`'s count, else `default`."""
    return thorough if settings.get_current_profile_name() == "thorough" else default


def bench_module(name: str) -> ModuleType:
    """The script bench/NAME.py as a module (bench/ is a folder of scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # before it runs: a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module
