"""Paths a user gives (--out, --trace, --model config, --cost, sweep entries) are the user's working folder's,
for every command and every child process it starts; nothing lands in the install folder.

Each command runs from a working folder outside the checkout with relative paths, and the test checks where
its files land. One test installs simctl without `-e` (a wheel's files in a folder of their own) and serves
from there: shipped data come from the package, outputs go to the working folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from simctl.traces.workload import Workload

pytest.importorskip("torch")
pytest.importorskip("transformers")


from simctl.profiler.profile import profile
from simctl.sim.run import RunConfig
from simctl.studies.sweep_spec import read_sweep, sweep_points

pytestmark = pytest.mark.torch

REPO = Path(__file__).resolve().parents[1]
SIMCTL = Path(sys.executable).parent / "simctl"
# the tiny-2l shape as a transformers config.json (fields simctl reads)
TINY_2L = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
           "intermediate_size": 688, "num_hidden_layers": 2, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 4096, "max_position_embeddings": 2048}


def user_folder(tmp_path: Path) -> Path:
    """A working folder outside the checkout with a relative trace file and model config in it."""
    work = tmp_path / "work"
    (work / "cfg").mkdir(parents=True)
    (work / "cfg" / "config.json").write_text(json.dumps(TINY_2L), encoding="utf-8")
    rows = "\n".join(f"{16 + 8 * i},{4 + i % 3},{0.05 * i:.2f}" for i in range(12))
    (work / "trace.csv").write_text("num_prefill_tokens,num_decode_tokens,arrived_at\n" + rows + "\n",
                                    encoding="utf-8")
    return work


def left_in_checkout(name: str) -> bool:
    return (REPO / name).exists()


def test_profile_writes_a_relative_out_in_the_working_folder(tmp_path: Path, monkeypatch) -> None:
    work = user_folder(tmp_path)
    monkeypatch.chdir(work)
    out = profile("cfg/config.json", "cpu", "float32", 1, True, "prof", progress=False, grid="test")
    assert out == work / "prof"
    assert (work / "prof" / "profile.csv").is_file()
    assert json.loads((work / "prof" / "meta.json").read_text(encoding="utf-8"))["model"] == str(
        work / "cfg" / "config.json")
    assert not left_in_checkout("prof")


def test_validate_with_a_relative_out_reads_back_its_real_runs(validated) -> None:
    """The bug this guards: the real runs' child resolved --out in the checkout, and validate then could not
    find their summaries (a traceback after every real run had run). conftest's `validated` ran from a working
    folder of its own with --out val."""
    report, out = validated
    assert report.rows
    assert list((out / "runs").rglob("summary.json"))
    assert (out / "validation.md").is_file()
    assert not left_in_checkout("val")


def test_configs_hold_absolute_paths_for_children_started_elsewhere(tmp_path: Path, monkeypatch) -> None:
    """A Ray task runs in a folder of its own: every path in a run's or a sweep point's configuration is
    absolute from the moment it is built; names of catalogue entries and length profiles stay names."""
    work = user_folder(tmp_path)
    (work / "fit.json").write_text("{}", encoding="utf-8")
    monkeypatch.chdir(work)
    config = RunConfig(workload=Workload(trace="trace.csv"), model="cfg/config.json", cost="fit.json",
                       gpu="cpu")
    assert (config.workload.trace, config.model, config.cost) == (
        str(work / "trace.csv"), str(work / "cfg" / "config.json"), str(work / "fit.json"))
    named = RunConfig(workload=Workload(trace="sharegpt"), model="tiny")
    assert (named.workload.trace, named.model, named.cost) == ("sharegpt", "tiny", None)
    (work / "sweep.toml").write_text('mode = "run"\ncost = "fit.json"\n[grid]\npolicy = ["vllm"]\n'
                                     'trace = ["trace.csv"]\nmodel = ["tiny"]\ngpu = ["cpu"]\nqps = [1.0]\n',
                                     encoding="utf-8")
    point = sweep_points(read_sweep(work / "sweep.toml"))[0].config
    assert (point.workload.trace, point.cost) == (str(work / "trace.csv"), str(work / "fit.json"))


def test_a_non_editable_install_serves_from_any_folder(tmp_path: Path) -> None:
    """simctl's files installed apart from the checkout (as `pip install .` puts them in site-packages): the
    shipped CPU fit is found through the package, a real run's child imports the installed simctl, and the
    outputs go to the working folder, never into the install folder or the checkout (this run is also the
    test that `simctl real` reads a relative trace and model config and writes a relative --out)."""
    site = tmp_path / "site"
    build = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                            "--no-build-isolation", "--target", str(site), str(REPO)], capture_output=True,
                           text=True, timeout=300, check=False)
    assert build.returncode == 0, build.stderr[-2000:]
    work = user_folder(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(site)}
    run = [sys.executable, "-c", "import sys; from simctl.cli import main; sys.argv[0] = 'simctl'; main()"]
    where = subprocess.run([sys.executable, "-c", "import simctl.engine as e; print(e.__file__)"], cwd=work,
                           env=env, capture_output=True, text=True, timeout=60, check=True)
    assert where.stdout.strip().startswith(str(site))
    sim = subprocess.run([*run, "run", "--gpu", "cpu", "--model", "tiny", "--trace", "trace.csv", "--out",
                          "out-sim"], cwd=work, env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert sim.returncode == 0, sim.stderr[-2000:]
    # a real run (its engine in a child process) of a relative trace and model config into a relative --out
    real = subprocess.run([*run, "real", "--policy", "vllm", "--trace", "trace.csv", "--model",
                           "cfg/config.json", "--threads", "1", "--out", "out-real"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=300, check=False)
    assert real.returncode == 0, real.stderr[-2000:]
    summary = json.loads((work / "out-real" / "summary.json").read_text(encoding="utf-8"))
    assert summary["completed"] == 12
    assert summary["trace"] == str(work / "trace.csv")  # recorded as the file it read
    assert (work / "out-real" / "requests.parquet").is_file()
    for name in ("out-sim", "out-real"):
        assert (work / name / "summary.json").is_file()
        assert not (site / name).exists() and not left_in_checkout(name)
