"""Real disaggregated serving (engine.disagg, issue 10): a prefill engine process and a decode engine process
give every request exactly the greedy tokens it gets alone, each request finishes once with its output tokens,
KV returns to zero in both instances, and the run's records have the simulated cluster's form. Misuse: one
line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from simctl.traces.workload import Workload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import TinyCost, simctl_here
from test_engine import MODEL, REQUESTS, SEED, SPEC

from simctl.engine.deployment import serve_deployment
from simctl.engine.setup import RealConfig, size_run

pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]
# test_engine's ten requests: a burst of six (they batch on the prefill instance and reach the decode instance
# together), then four a few milliseconds apart; one of a single output token never leaves its prefill
# instance


def serve_pd(model, policy: str, kv_capacity: int | None = None, **options):
    config = RealConfig(policy=policy, workload=Workload(trace="sharegpt", qps=1.0, num_requests=100,
                                                         seed=SEED),
                        model=MODEL, options=options, kv_capacity=kv_capacity, threads=1, prefill_instances=1,
                        decode_instances=1)
    config.validate()
    size = size_run(config, REQUESTS, SPEC.kv_bytes_per_token(4), 1 << 30)
    run, served = serve_deployment(config, size, REQUESTS, model)
    return run, served.fields, size


@pytest.mark.parametrize("policy,kv_capacity,options", [
    ("vllm", None, {}),
    ("sarathi", None, {"token_budget": 16}),  # prompts chunked on the prefill instance
    ("vllm", 112, {}),  # KV for about two requests: both instances queue, the decode instance preempts
])
def test_each_request_gets_its_tokens_alone_once_and_kv_returns(
        model, alone, policy, kv_capacity, options) -> None:
    run, fields, size = serve_pd(model, policy, kv_capacity, **options)
    s, req = run.summary, run.result.requests.set_index("request_id")
    assert not run.result.aborted and s["completed"] == len(REQUESTS)
    for r in REQUESTS:
        assert run.engine.tokens[r.id] == alone(r), f"request {r.id}: tokens differ from its run alone"
        row = req.loc[r.id]
        assert row["generated_tokens"] == row["output_tokens"] == r.output_tokens
        assert (row["arrival_s"] <= row["first_scheduled_s"] <= row["prefill_done_s"] <= row["first_token_s"]
                <= row["completion_s"])
        assert row["prefill_replica"] == 0 and row["decode_replica"] == (0 if r.output_tokens > 1 else -1)
    assert fields["kv_used_at_end"] == {"prefill": 0, "decode": 0}
    for pool in ("prefill", "decode"):
        assert 0 < s["pools"][pool]["kv_peak_tokens"] <= size.kv_capacity
    crossing = [r for r in REQUESTS if r.output_tokens > 1]
    link = s["kv_link"]
    assert link["transfers"] == len(crossing)
    assert link["bytes"] == sum(r.prompt_tokens for r in crossing) * SPEC.kv_bytes_per_token(4)
    assert link["wait_s_p50"] >= 0 and link["transfer_s_p50"] > 0
    # every output token but each request's first is a decode row of the decode instance
    its = run.iterations
    decode_its = its[its["pool"] == "decode"]
    preempted = int(req["preemptions"].sum())
    assert decode_its["decode_tokens"].sum() == sum(r.output_tokens - 1 for r in crossing) - preempted
    assert (its[its["pool"] == "prefill"]["decode_tokens"] == 0).all()
    if kv_capacity is not None:
        assert preempted > 0, "the small KV capacity was meant to force preemptions"


PD = ("--prefill-instances", "1", "--decode-instances", "1")


@pytest.mark.parametrize("args,message", [
    (("--prefill-instances", "2", "--decode-instances", "1"), "one prefill and one decode instance"),
    (("--prefill-instances", "1"), "one prefill and one decode instance"),
    (("--prefill-instances", "0", "--decode-instances", "1"),
     "--prefill-instances must be an integer from 1"),
    ((*PD, "--policy", "faster-transformer"), "cannot serve disaggregated"),
    ((*PD, "--device", "cuda"), "runs on the CPU"),
])
def test_bad_real_pd_input_is_one_line_exit_2(tmp_path: Path, args: tuple[str, ...],
                                             message: str) -> None:
    out = tmp_path / "out"
    res = simctl_here("real", "--num-requests", "5", *args, "--out", out)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert res.stderr.count("\n") == 1 and message in res.stderr, res.stderr
    assert not out.exists()


def test_validate_compares_a_real_pd_run_with_the_simulated_cluster(tmp_path: Path) -> None:
    from simctl.studies.capacity import SLO
    from simctl.validation.validate import validate_main

    out = tmp_path / "val"
    report = validate_main(["vllm"], Workload(trace="sharegpt", qps=None, num_requests=100, scale=0.02),
                           [0.5], cost=TinyCost(), out=out, model=MODEL, threads=1,
                           slo=SLO({"p50_ttft": 0.004}), prefill_instances=1, decode_instances=1)
    row = report.rows[0]
    assert row["identical_requests"] and row["real_completed"] == row["sim_completed"] == 100
    matched, total = (int(v) for v in row["replay_matched"].split("/"))
    assert matched == total > 0, "every iteration of both instances re-planned as the engines ran it"
    assert report.evidence[0]["replay_tbt_matches"], "the replayed token gaps are the real run's"
    where = out / "runs/vllm/load_0.5/real"  # the real run's files, as `simctl real` writes a P/D pair's
    real = json.loads((where / "summary.json").read_text())
    sim = json.loads((out / "runs/vllm/load_0.5/sim/summary.json").read_text())
    assert set(real["pools"]) == set(sim["pools"]) == {"prefill", "decode"}
    assert real["mode"] == "real" and real["threads"] == 1 and real["kv_link"]["transfers"] > 0
    assert list(pd.read_parquet(where / "replicas.parquet")["pool"]) == ["prefill", "decode"]
    assert set(pd.read_parquet(where / "iterations.parquet")["pool"]) == {"prefill", "decode"}
    # the twin's link is the one the real run measured
    assert sim["kv_link"]["gbps"] == real["kv_link"]["gbps"]
    replay = pd.read_parquet(out / "runs/vllm/load_0.5/replay.parquet")
    assert set(replay["pool"]) == {"prefill", "decode"}


def test_validate_pd_refuses_threads_the_cores_cannot_hold(tmp_path: Path) -> None:
    from simctl.common.errors import InputError
    from simctl.executor.runtime import default_threads
    from simctl.validation.validate import validate_main

    with pytest.raises(InputError, match="two instances"):
        validate_main(["vllm"], loads=[0.5], cost=TinyCost(), out=tmp_path / "val", model=MODEL,
                      threads=default_threads(), prefill_instances=1, decode_instances=1)


def test_a_prefill_instance_killed_while_starting_says_why() -> None:
    """Its exit status, not "code -9": the kernel's out-of-memory killer is named (issue 35)."""
    from types import SimpleNamespace

    from simctl.engine.disagg import _await_ready

    def eof() -> None:
        raise EOFError

    child = SimpleNamespace(exitcode=-9, join=lambda timeout=None: None)
    conn = SimpleNamespace(poll=lambda timeout=None: True, recv=eof)
    with pytest.raises(RuntimeError) as e:
        _await_ready(child, conn)
    assert str(e.value) == ("prefill instance failed: killed by the kernel (SIGKILL), most likely out of "
                            "memory, while starting")
