"""Baton's query sets (Section 5.1) and `simctl query-set` (Tables 1-2)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from conftest import simctl_here

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.kv_capacity import kv_capacity_tokens
from simctl.costs.roofline import Roofline
from simctl.studies.query_set import QUERY_SETS, completion_time, query_set

pytestmark = pytest.mark.torch


def test_the_sets_have_the_papers_sizes_mix_and_ranges() -> None:
    """Section 5.1's word ranges at 1.5 Llama-2 tokens a word: long 3,600-4,400 words, short 32-400 (mixed),
    32-200 (short)."""
    mixed = query_set("mixed", seed=3)
    assert len(mixed) == 120 and all(r.arrival_s == 0.0 for r in mixed)
    long_in = [r for r in mixed if r.prompt_tokens >= 5400]
    long_out = [r for r in mixed if r.output_tokens >= 5400]
    assert len(long_in) == len(long_out) == 30  # 1:1:2
    assert all(r.prompt_tokens <= 6600 and 48 <= r.output_tokens <= 600 for r in long_in)
    assert all(r.output_tokens <= 6600 and 48 <= r.prompt_tokens <= 600 for r in long_out)
    assert sorted(r.id for r in mixed) == list(range(120))
    assert [r.prompt_tokens >= 5400 for r in mixed[:30]].count(True) < 30  # kinds are shuffled
    short = query_set("short", seed=3)
    assert len(short) == 30 and all(48 <= r.prompt_tokens <= 300 and 48 <= r.output_tokens <= 300
                                    for r in short)
    assert query_set("short", seed=3) == short and query_set("short", seed=4) != short
    assert all(r.prompt_tokens == max(1, round(s.prompt_tokens * 0.1))
               for r, s in zip(query_set("short", 3, 0.1), short))


def test_query_level_batching_completes_the_set_first() -> None:
    """The paper's ordering: Baton (with P&D) completes a set before full batching, whose batches wait for
    their longest query."""
    requests = query_set("short")
    cost = Roofline("llama-2-7b", "rtx-4090")
    kv = kv_capacity_tokens(get_model("llama-2-7b"), get_gpu("rtx-4090"))
    for b in (2, 6):
        t = {p: completion_time(p, requests, b, cost, kv)["completion_s"]
             for p in ("hf-padded", "pd", "baton", "baton-pd")}
        assert t["baton-pd"] < t["baton"] < t["hf-padded"]
    assert set(QUERY_SETS) == {"mixed", "short"}


def _simctl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "simctl.cli", *args], capture_output=True, text=True,
                          check=False)


def test_cli_reports_each_policy_and_batch_size(tmp_path) -> None:
    out = tmp_path / "qs"
    r = _simctl("query-set", "--set", "short", "--batch-size", "2,4", "--json", "--out", str(out))
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)["rows"]
    assert [(x["batch_size"], x["policy"]) for x in rows] == [
        (b, p) for b in (2, 4) for p in ("hf-padded", "pd", "baton", "baton-pd")]
    assert all(x["speedup_vs_hf_padded"] == pytest.approx(
        next(y["completion_s"] for y in rows if y["policy"] == "hf-padded"
             and y["batch_size"] == x["batch_size"])
        / x["completion_s"]) for x in rows)
    assert sorted(p.name for p in out.iterdir()) == ["query_set.parquet", "summary.json"]


def test_the_mixed_set_runs_past_llama2s_context_with_a_warning() -> None:
    """The mixed set's long queries (~6,000 tokens) pass Llama-2's 4,096 positions as the paper's Hugging Face
    runs did: simulated, with a warning recorded, not refused."""
    r = _simctl("query-set", "--set", "mixed", "--batch-size", "8", "--policy", "baton-pd", "--gpu", "a6000",
                "--json")
    assert r.returncode == 0, r.stderr
    assert "past the context" in r.stderr and "context of 4096" in r.stderr
    assert any("past the context" in w for w in json.loads(r.stdout)["warnings"])


def test_step_overhead_is_paid_once_per_iteration_and_recorded() -> None:
    """--step-overhead-ms 10 instead of the default (18.1 us for each of Llama-2-7B's 32 layers) adds the
    difference to every iteration (cuda-graph: no floor), and the summary records the step overheads the run
    assumed."""
    runs = {}
    for extra in ((), ("--step-overhead-ms", "10")):
        r = _simctl("query-set", "--set", "short", "--batch-size", "2", "--policy", "hf-padded", "--json",
                    *extra)
        assert r.returncode == 0, r.stderr
        runs[extra] = json.loads(r.stdout)
    base, slow = runs[()], runs[("--step-overhead-ms", "10")]
    (b,), (s,) = base["rows"], slow["rows"]
    assert b["iterations"] == s["iterations"]
    default = 32 * 18.1e-6
    added = (10e-3 - default) * b["iterations"]
    assert s["completion_s"] - b["completion_s"] == pytest.approx(added, rel=1e-9)
    assert base["cost_assumptions"]["step_overheads"]["iteration_s"] == pytest.approx(default, rel=1e-12)
    assert slow["cost_assumptions"]["step_overheads"]["iteration_s"] == 10e-3


def test_eager_execution_prices_the_launch_floor() -> None:
    r = _simctl("query-set", "--set", "short", "--batch-size", "2", "--policy", "hf-padded", "--json",
                "--execution", "eager")
    assert r.returncode == 0, r.stderr
    steps = json.loads(r.stdout)["cost_assumptions"]["step_overheads"]
    assert steps["execution"] == "eager" and steps["launch_floor_s"] == pytest.approx(22e-3)


@pytest.mark.parametrize("args,needle", [
    (("--set", "huge"), "unknown query set 'huge'"),
    (("--execution", "warp"), "execution must be one of cuda-graph, eager"),
    (("--step-overhead-ms", "-1"), "--step-overhead-ms must be a finite number >= 0"),
    (("--cost", "x.json", "--execution", "eager"), "a --cost model has its own"),
    (("--batch-size", "0"), "every batch size must be >= 1"),
    (("--policy", "nope"), "unknown policy 'nope'"),
])
def test_bad_input_is_one_line(args, needle) -> None:
    r = simctl_here("query-set", *args)
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_real_run_of_a_set_next_to_its_twin(monkeypatch: pytest.MonkeyPatch) -> None:
    from simctl.engine import real
    from simctl.query_set_cmd import _real_point

    requests = query_set("short", seed=0, scale=0.1)[:6]
    runs, serve = [], real.real_main

    def recorded(**kwargs):
        runs.append(serve(**kwargs))
        return runs[-1]

    monkeypatch.setattr(real, "real_main", recorded)
    point = _real_point("baton", requests, 2, "tiny", "cpu", 0)
    (run,) = runs
    assert point["real_min_s"] == point["real_completion_s"] == point["real_max_s"] == run["makespan_s"] > 0
    assert point["twin_completion_s"] > 0 and point["real_batch_size"] == 2
    assert point["twin_error"] == pytest.approx(point["twin_completion_s"] / point["real_completion_s"] - 1)
    # repeats (a real run costs a child each, so here the one run's summary, its makespan changed and its
    # trace this call's file): the median completion time and the range, next to the twin of the first
    makespans = iter([3.0, 1.0, 2.0])
    monkeypatch.setattr(real, "real_main", lambda **kwargs: {**run, "trace": kwargs["workload"].trace,
                                                             "makespan_s": next(makespans)})
    again = _real_point("baton", requests, 2, "tiny", "cpu", 0, repeats=3)
    assert (again["real_min_s"], again["real_completion_s"], again["real_max_s"]) == (1.0, 2.0, 3.0)
    assert again["twin_completion_s"] == point["twin_completion_s"]
    assert again["twin_error"] == pytest.approx(point["twin_completion_s"] / 2.0 - 1)
