"""bench/profile_vs_cost.py: a profile priced by another cost model, per kind (no GPU needed)."""

from __future__ import annotations

import json

import pytest
from conftest import bench_module

from simctl.costs.fitted import Fitted
from simctl.costs.overheads import StepOverheads
from simctl.profiler.profile_data import load_profile
from tests.test_fit import META, design, synth_times, write_profile

pytestmark = pytest.mark.unit

bench = bench_module("profile_vs_cost")


def test_a_profile_priced_by_its_own_exact_fit_is_one_and_host_terms_are_added(tmp_path):
    from simctl.profiler.fit import fit_profile

    d = write_profile(tmp_path / "p", design(), synth_times(design()))
    fit_profile(d, plot=False)
    df, _ = load_profile(d)
    cost = Fitted.load(d / "cost_model.json")
    table = bench.ratios(df, cost)
    assert set(table.index) == {*df["kind"].unique(), "overall"}
    assert table["median"].to_numpy() == pytest.approx(1.0, abs=1e-3)
    # step overheads: 1 ms a step and 10 us a request on top of the form; a launch floor of 1 s above all
    data = json.loads((d / "cost_model.json").read_text())
    data["step_overheads"] = StepOverheads("eager", 1e-3, 1e-5, 0.0, 0.0, "test").to_json()
    with_host = Fitted.from_json(data)
    extra = bench.priced(df, with_host) - bench.priced(df, cost)
    assert extra == pytest.approx(1e-3 + 1e-5 * df["batch_size"].to_numpy(), rel=1e-6)
    data["step_overheads"]["launch_floor_s"] = 1.0
    host = 1e-3 + 1e-5 * df["batch_size"].to_numpy()
    assert bench.priced(df, Fitted.from_json(data)) == pytest.approx(1.0 + host)


def test_another_models_cost_is_refused_in_one_line(tmp_path, capsys):
    d = write_profile(tmp_path / "p", design(), synth_times(design()))
    other = tmp_path / "other.json"
    from simctl.profiler.fit import fit_profile

    fit_profile(d, plot=False)
    data = json.loads((d / "cost_model.json").read_text())
    data["model"] = "llama-2-7b"
    other.write_text(json.dumps(data))
    assert bench.main([str(d), str(other)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "fitted for model 'llama-2-7b', not 'tiny'" in err
    assert META["model"] == "tiny"
