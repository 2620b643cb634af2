"""`simctl sweep`: the grid's points (validated before anything runs, duplicates collapsed, keyed by their
full configuration), a cache that lets an interrupted sweep resume without recomputing finished points, the
same table from one process, a pool or Ray, and bad input as one line."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd
import pytest

import simctl.studies.sweep
from simctl.cli import main
from simctl.common.errors import InputError
from simctl.studies.sweep import POINTS_DIR, run_sweep
from simctl.studies.sweep_spec import sweep_points

SPEC = {"mode": "run", "num_requests": 100, "seeds": [0],
        "grid": {"policy": ["vllm", "sarathi"], "trace": ["sharegpt"], "qps": [0.5, 2.0],
                 "token_budget": [256, 512]},
        "slo": {"strict": "p99_tbt=0.1", "per_request": "ttft=1,tpot=0.05"}}


def cli(capsys: pytest.CaptureFixture[str], *args: str | Path) -> tuple[int, str]:
    with pytest.raises(SystemExit) as e:
        main([str(a) for a in args])
    return int(e.value.code or 0), capsys.readouterr().err


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    return table.drop(columns=["sim_wall_s"]).sort_values(["variant", "qps", "slo"]).reset_index(drop=True)


def test_points_collapse_settings_a_policy_does_not_take() -> None:
    points = sweep_points(SPEC)
    # vllm takes no token budget: 2 rates; sarathi: 2 rates x 2 budgets
    assert sorted(p.labels["variant"] for p in points) == ["sarathi token_budget=256"] * 2 + [
        "sarathi token_budget=512"] * 2 + ["vllm"] * 2
    assert len({p.key for p in points}) == 6
    again = sweep_points(json.loads(json.dumps(SPEC)))
    assert [p.key for p in again] == [p.key for p in points]  # a key is its configuration, nothing else
    other = sweep_points({**SPEC, "num_requests": 101})
    assert not {p.key for p in other} & {p.key for p in points}


def test_run_points_are_judged_against_every_slo(tmp_path: Path) -> None:
    result = run_sweep(sweep_points(SPEC), tmp_path / "out")
    t = result.table
    assert len(t) == 12 and set(t["slo"]) == {"strict", "per_request"}
    strict = t[t["slo"] == "strict"]
    assert (strict["slo_met"] == ((strict["tbt_p99"] <= 0.1) & strict["sustainable"]
                                  & (strict["sched_delay_p50"] <= 2))).all()
    per = t[t["slo"] == "per_request"]
    assert per["slo_attainment"].between(0,
                                         1).all() and (per["slo_met"] == (per["slo_attainment"] >= 0.9)).all()
    assert (t["completed"] == 100).all() and len(result.probes) == 0
    assert len(list((tmp_path / "out" / POINTS_DIR).glob("*.json"))) == 6


def test_an_interrupted_sweep_resumes_without_recomputing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    points = sweep_points(SPEC)
    out = tmp_path / "out"
    real = simctl.studies.sweep.compute_point
    calls: list[str] = []

    def interrupted_after_two(point):
        if len(calls) == 2:
            raise KeyboardInterrupt
        calls.append(point.key)
        return real(point)

    monkeypatch.setattr(simctl.studies.sweep, "compute_point", interrupted_after_two)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(points, out)
    assert sorted(p.stem for p in (out / POINTS_DIR).iterdir()) == sorted(calls)  # finished points, whole
    assert not (out / "sweep.parquet").exists()
    first = list(calls)

    def counted(point):
        calls.append(point.key)
        return real(point)

    monkeypatch.setattr(simctl.studies.sweep, "compute_point", counted)
    resumed = run_sweep(points, out)
    assert resumed.reused == 2 and len(calls) == 6 and not set(calls[2:]) & set(first)
    calls.clear()
    again = run_sweep(points, out)
    assert again.reused == 6 and calls == []
    (out / POINTS_DIR / f"{points[0].key}.json").write_text("{truncated")  # unreadable: computed again
    assert run_sweep(points, out).reused == 5 and calls == [points[0].key]
    pd.testing.assert_frame_equal(comparable(resumed.table), comparable(again.table))


def test_a_pool_gives_the_table_of_one_process(tmp_path: Path) -> None:
    points = sweep_points(SPEC)
    one = run_sweep(points, tmp_path / "one", workers=1)
    two = run_sweep(points, tmp_path / "two", workers=2)
    pd.testing.assert_frame_equal(comparable(one.table), comparable(two.table))


def test_capacity_points_and_their_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "cap.toml"
    spec.write_text('mode = "capacity"\nnum_requests = 100\nseeds = [0, 1]\n'
                    '[grid]\npolicy = ["vllm", "sarathi"]\n[slo]\nstrict = "p99_tbt=0.1"\n')
    out = tmp_path / "out"
    code, err = cli(capsys, "sweep", spec, "--out", out, "--workers", "1")
    assert code == 0, err
    table = pd.read_parquet(out / "sweep.parquet")
    probes = pd.read_parquet(out / "probes.parquet")
    assert len(table) == 4 and (table["capacity_qps"] > 0).all()
    for _, row in table.iterrows():  # the capacity is a probed rate that met the SLO
        mine = probes[(probes["variant"] == row["variant"]) & (probes["seed"] == row["seed"])]
        assert len(mine) == row["probes"]
        assert mine.loc[mine["qps"] == row["capacity_qps"], "slo_met"].all()
    png = tmp_path / "cap.png"
    assert cli(capsys, "plot", "capacity", out, "--out", png)[0] == 0 and png.stat().st_size > 10_000


@pytest.mark.parametrize(("text", "words"), [
    ('mode = "run"\ncolour = 1\n[grid]\nqps = [1]\n', "unknown field 'colour'"),
    ('[grid]\npolicy = ["vllm"]\nreplica = [2]\nqps = [1]\n', "unknown field 'replica'"),
    ('[grid]\npolicy = ["vllm"]\nreplicas = [0]\nqps = [1]\n', "--replicas must be an integer from 1"),
    ('[grid]\npolicy = ["vllm"]\nrouter = ["fastest"]\nqps = [1]\n', "unknown --router 'fastest'"),
    ('[grid]\npolicy = ["vllm"]\nprefill_tp = [2]\nqps = [1]\n', "--prefill-tp needs --prefill-instances"),
    ("[grid]\n", "grid is empty"),
    ('[grid]\npolicy = []\nqps = [1]\n', "empty list"),
    ('[grid]\npolicy = ["vllm"]\n', "needs grid.qps"),
    ('mode = "capacity"\n[grid]\npolicy = ["vllm"]\n', "needs at least one SLO"),
    ('mode = "fast"\n[grid]\nqps = [1]\n', "mode 'fast'"),
    ('[grid]\npolicy = ["nope"]\nqps = [1]\n', "nope"),
    ('[grid]\nqps = [-1]\n', "--qps"),
    ('[grid]\nqps = [1]\nmodel = ["gpt-9"]\n', "gpt-9"),
    ('[grid]\nqps = [1]\n[slo]\nx = "p99_tbt=fast"\n', "slo.x"),
    ('num_requests = "many"\n[grid]\nqps = [1]\n', "num_requests must be int"),
    ("[grid\n", "not valid TOML"),
])
def test_bad_sweep_files_are_one_line(text: str, words: str, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text(text)
    code, err = cli(capsys, "sweep", spec, "--out", tmp_path / "out")
    assert code == 2 and err.count("\n") == 1 and words in err, err
    assert not (tmp_path / "out").exists()


def test_bad_sweep_options_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = tmp_path / "s.toml"
    spec.write_text('num_requests = 20\n[grid]\nqps = [1]\n')
    has_ray = importlib.util.find_spec("ray") is not None  # without it, --ray says how to install it
    for args, words in ((("--ray", "127.0.0.1:1"), "127.0.0.1:1" if has_ray else "pip install 'simctl[ray]'"),
                        (("--workers", "0"), "--workers"), (("--ray", "nowhere"), "--ray")):
        code, err = cli(capsys, "sweep", spec, "--out", tmp_path / "out", *args)
        assert code == 2 and err.count("\n") == 1 and words in err, err
        assert not (tmp_path / "out").exists()
    code, err = cli(capsys, "sweep", tmp_path / "missing.toml", "--out", tmp_path / "out")
    assert code == 2 and "no such file" in err
    with pytest.raises(InputError, match="seeds"):
        sweep_points({"seeds": [0.5], "grid": {"qps": [1]}})


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray is not installed (the ray extra)")
def test_ray_gives_the_table_of_one_process(tmp_path: Path) -> None:
    spec = {**SPEC, "grid": {**SPEC["grid"], "policy": ["sarathi"], "token_budget": [512]}}
    points = sweep_points(spec)
    local = run_sweep(points, tmp_path / "local")
    on_ray = run_sweep(points, tmp_path / "ray", ray_address="local")
    assert on_ray.reused == 0
    pd.testing.assert_frame_equal(comparable(local.table), comparable(on_ray.table))


def test_replicas_and_routers_are_grid_fields(tmp_path: Path) -> None:
    """A point with replicas runs the cluster (one replica gives the single-replica results; more replicas
    serve the same rate with lower latency); a capacity point reports its rate per GPU too."""
    spec = {"mode": "run", "num_requests": 120,
            "grid": {"policy": ["vllm"], "trace": ["sharegpt"], "qps": [3.0],
                                                         "replicas": [1, 2], "router": ["round-robin"]}}
    points = sweep_points(spec)
    assert sorted(p.cluster.replicas for p in points) == [1, 2] and all(p.labels["router"] for p in points)
    table = run_sweep(points, tmp_path / "run").table.set_index("replicas")
    assert table.loc[2, "e2e_p50"] < table.loc[1, "e2e_p50"]
    alone = run_sweep(sweep_points({**spec, "grid": {k: v for k, v in spec["grid"].items()
                                                     if k not in ("replicas", "router")}}),
                                                     tmp_path / "one").table
    assert table.loc[1, "e2e_p50"] == alone["e2e_p50"].iloc[0]
    cap = {"mode": "capacity", "num_requests": 100, "slo": {"loose": "p99_tbt=0.5"},
           "grid": {"policy": ["vllm"], "trace": ["sharegpt"], "replicas": [2]}}
    row = run_sweep(sweep_points(cap), tmp_path / "cap").table.iloc[0]
    assert row["gpus"] == 2 and row["capacity_qps_per_gpu"] == pytest.approx(row["capacity_qps"] / 2)


def test_disaggregated_pools_and_their_tp_are_grid_fields(tmp_path: Path) -> None:
    """DistServe's placement (prefill TP2, decode TP1) as a capacity point: its rate per GPU counts 3 GPUs."""
    cap = {"mode": "capacity", "num_requests": 100, "scale": 0.1, "slo": {"loose": "p99_tbt=0.5"},
           "grid": {"policy": ["vllm"], "trace": ["sharegpt"], "model": ["llama-2-13b"],
                    "prefill_instances": [1], "decode_instances": [1], "kv_link_gbps": [100.0],
                    "prefill_tp": [1, 2]}}
    points = sweep_points(cap)
    assert sorted(p.cluster.prefill_tp for p in points) == [1, 2] and len({p.key for p in points}) == 2
    table = run_sweep(points, tmp_path / "cap").table.set_index("prefill_tp")
    assert list(table.loc[[1, 2], "gpus"]) == [2, 3]
    assert table.loc[2, "capacity_qps_per_gpu"] == pytest.approx(table.loc[2, "capacity_qps"] / 3)
