"""`--execution` and `--step-overhead-ms`, one section (`simctl.configs.Execution`) for `run`, `capacity`,
`plan` and `query-set`: the roofline's step overheads (costs/overheads.py), defaults unchanged."""

from __future__ import annotations

import inspect
import json

import pytest
from conftest import simctl_here

from simctl.capacity_cmd import capacity
from simctl.configs import Execution
from simctl.plan_cmd import plan_cmd
from simctl.query_set_cmd import query_set_cmd
from simctl.run_cmd import run
from simctl.sim.run import RunConfig, deploy


@pytest.mark.parametrize("command", [run, capacity, plan_cmd, query_set_cmd])
def test_every_command_takes_the_one_section(command) -> None:
    param = inspect.signature(command).parameters["execution"]
    assert param.default == Execution() == Execution(None, None)


def _decode_step_s(**overheads) -> float:
    """One decode step of one 100-token request, mistral-7b on an A100, as `run` prices it."""
    from simctl.policies.plan import hybrid
    from simctl.policies.seq import Seq

    cost = deploy(RunConfig(**overheads), "a100-80gb", 1).cost
    s = Seq(0, 0.0, 100, 10)
    s.computed = 100
    return cost.iteration_time(hybrid([s], [], []))


def test_overheads_price_each_step_as_given() -> None:
    graphs = _decode_step_s()
    # the same roofline: --step-overhead-ms 10 replaces the default's 18.1 us a layer (32 layers; its 0.118 ms
    # for the one request stays; no launch floor)
    assert _decode_step_s(step_overhead_ms=10.0) - graphs == pytest.approx(10e-3 - 32 * 18.1e-6, abs=1e-12)
    assert _decode_step_s(execution="cuda-graph") == graphs
    # eager: a 32-layer model's kernels launched from Python take 22 ms (0.6875 ms a layer), more than a
    # 7B decode's kernels on an A100 (~9 ms of weights read): the step costs the floor plus the host's terms
    host = 32 * 18.1e-6 + 0.118e-3
    assert graphs < 22e-3 and _decode_step_s(execution="eager") == pytest.approx(22e-3 + host)


def test_a_run_records_its_execution_only_when_given() -> None:
    assert "execution" not in RunConfig().recorded() and "step_overhead_ms" not in RunConfig().recorded()
    assert RunConfig(execution="eager").recorded()["execution"] == "eager"


def test_run_cli_prices_eager_steps() -> None:
    args = ("run", "--policy", "vllm", "--trace", "sharegpt", "--qps", "1", "--num-requests", "20", "--json")
    base, eager = (json.loads(simctl_here(*args, *extra).stdout) for extra in ((), ("--execution", "eager")))
    assert eager["execution"] == "eager" and "execution" not in base
    assert eager["tbt_p50"] >= 22e-3 + 32 * 18.1e-6 > base["tbt_p50"]  # every decode step pays the floor


@pytest.mark.parametrize("args,needle", [
    (("run", "--execution", "warp"), "--execution must be one of cuda-graph, eager"),
    (("capacity", "--step-overhead-ms", "-1"), "--step-overhead-ms must be a finite number >= 0"),
    (("plan", "--rate", "1", "--slo", "p99_tbt=1", "--cost", "x.json", "--execution", "eager"),
     "a --cost model has its own"),
])
def test_bad_input_is_one_line(args, needle) -> None:
    r = simctl_here(*args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1

