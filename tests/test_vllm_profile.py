"""`simctl profile --engine vllm`: vLLM's own steps timed at controlled shapes, written as a profile that
`simctl fit` fits unchanged. The real profile is marked `vllm_profile` (select it with `-m vllm_profile`; it
skips without vLLM installed)."""

from __future__ import annotations

import json
import sys
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from simctl.cli import main
from simctl.costs.features import plan_features
from simctl.executor.vllm_runtime import INSTALL_HINT
from simctl.policies.plan import hybrid
from simctl.policies.seq import Seq
from simctl.profiler.vllm_grid import StepProbe, vllm_grid
from simctl.profiler.vllm_worker import StepDriver, cohort_lengths, cohort_prompts, kind_of

pytestmark = pytest.mark.vllm


def _seq(prompt: int, computed: int, generated: int) -> Seq:
    s = Seq(0, 0.0, prompt, 100)
    s.computed, s.generated = computed, generated
    return s


def test_a_scheduler_output_becomes_the_plan_the_simulator_builds() -> None:
    """Two running decodes (contexts 40 and 7), a resumed chunk (64 of a 200-token prompt on 100 cached) and a
    new prompt's first chunk (30 on 0): the plan is `hybrid`'s, decodes first, and only the decodes sample."""
    requests = {"a": SimpleNamespace(num_prompt_tokens=30, num_output_tokens=11, max_tokens=50),
                "b": SimpleNamespace(num_prompt_tokens=5, num_output_tokens=3, max_tokens=50),
                "c": SimpleNamespace(num_prompt_tokens=200, num_output_tokens=0, max_tokens=2),
                "d": SimpleNamespace(num_prompt_tokens=90, num_output_tokens=0, max_tokens=2)}
    out = SimpleNamespace(
        scheduled_new_reqs=[SimpleNamespace(req_id="d", num_computed_tokens=0)],
        scheduled_cached_reqs=SimpleNamespace(req_ids=["a", "c", "b"], num_computed_tokens=[40, 100, 7]),
        num_scheduled_tokens={"a": 1, "c": 64, "b": 1, "d": 30})
    driver = StepDriver.__new__(StepDriver)
    driver.scheduler = SimpleNamespace(requests=requests)
    plan = driver.plan_of(out)
    expected = hybrid([_seq(30, 40, 11), _seq(5, 7, 3)], [_seq(200, 100, 0), _seq(90, 0, 0)], [64, 30])
    assert plan_features(plan) == plan_features(expected)
    assert plan_features(plan) == {"batch_size": 4, "linear_tokens": 96, "sampled_tokens": 2,
                                   "num_segments": 2, "attn_units": 64 * (100 + 32) + 30 * 15,
                                   "attn_kv_tokens": 164 + 30, "decode_rows": 2, "decode_kv": 49,
                                   "decode_pad_kv": 2 * 41 - 49, "eager_step": 0}
    assert kind_of(plan) == "hybrid"


def test_a_step_past_what_the_request_knows_is_an_error() -> None:
    out = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="a", num_computed_tokens=0)],
                          scheduled_cached_reqs=SimpleNamespace(req_ids=[], num_computed_tokens=[]),
                          num_scheduled_tokens={"a": 11})
    driver = StepDriver.__new__(StepDriver)
    driver.scheduler = SimpleNamespace(
        requests={"a": SimpleNamespace(num_prompt_tokens=10, num_output_tokens=0, max_tokens=1)})
    with pytest.raises(RuntimeError, match="11 tokens on 0 of 10 known"):
        driver.plan_of(out)


def test_cohorts_centre_their_timed_steps_and_outlive_them() -> None:
    # 16 decodes at 1024, 6 timed steps: prompts of 1024 - 1 - 3; prefilled in 4 steps of 4096 (the first
    # requests decode meanwhile), then the warm-up step and 6 timed ones, and 4 to spare
    assert cohort_lengths(StepProbe("decode", 16, 1024), 6, 4096) == (1020, 6 + 4 + 4)
    # a mixed probe with a cached chunk takes two decode steps a repetition
    assert cohort_lengths(StepProbe("hybrid", 4, 100, 32, 32), 5, 4096) == (94, 10 + 1 + 4)


def test_a_spread_cohort_spreads_its_prompts_evenly_around_the_middle() -> None:
    probe = StepProbe("decode", 5, 1024, spread=400)
    prompt, outputs = cohort_lengths(probe, 6, 4096)
    # prompts 620..1420 (5 x 1020 on average): prefilled in 2 steps of 4096 (the longest counted)
    assert (prompt, outputs) == (1020, 6 + 2 + 4)
    assert cohort_prompts(probe, prompt) == [620, 820, 1020, 1220, 1420]
    assert cohort_prompts(StepProbe("decode", 3, 64), 60) == [60, 60, 60]
    assert cohort_prompts(StepProbe("decode", 2, 64, spread=100), 60) == [1, 160]  # no prompt below 1
    assert probe.label() == "decode 5 decodes at 1024 +- 400"


@pytest.mark.parametrize("args,words", [
    (["--attention", "math"], ["--attention applies to --engine simctl"]),
    (["--protocol", "fixed"], ["--protocol applies to --engine simctl"]),
    (["--threads", "1"], ["--threads applies to --engine simctl"]),
    (["--device", "cuda"], ["--device cuda", "CPU build"]),
])
def test_misuse_is_one_line_exit_2(args: list[str], words: list[str], capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--engine", "vllm", "--out", str(tmp_path / "p"), *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("simctl: error: "), err
    assert all(w in err for w in words), err


def test_an_unknown_engine_is_one_line_exit_2(capsys, tmp_path) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--engine", "tgi", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err == "simctl: error: --engine 'tgi': choose simctl or vllm\n"


def test_without_vllm_the_cli_says_how_to_install_it(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "--engine", "vllm", "--quick", "--out", str(tmp_path / "p")])
    assert exit_.value.code == 2 and capsys.readouterr().err == f"simctl: error: {INSTALL_HINT}\n"
    assert not (tmp_path / "p").exists()


@pytest.mark.slow
def test_a_quick_vllm_profile_fits_unchanged(tmp_path, capsys) -> None:
    """A profile of the installed vLLM (the test grid: every kind of probe and a served stage), then `simctl
    fit`: every row has the features of the step vLLM actually scheduled (the probe's shape), the fit reports
    its held-out error and reproduces its rows, and the served stage's steps give the fit its host terms."""
    pytest.importorskip("vllm")
    from simctl.costs.fitted import Fitted
    from simctl.profiler.fit import fit_profile
    from simctl.profiler.vllm_profile import profile_vllm

    out = tmp_path / "vllm-tiny"
    # the test grid: the quick one's kinds of probe and served stage, fewer of each (the CLI's --quick picks
    # the quick grid; its options' errors are test_misuse_is_one_line_exit_2's)
    profile_vllm("tiny", "float32", False, out, progress=False, grid="test")
    meta = json.loads((out / "meta.json").read_text())
    assert meta["engine"] == "vllm" and meta["vllm_version"].startswith("vllm")
    assert meta["device"] == "cpu" and meta["dtype"] == "float32"
    assert meta["engine_settings"]["enable_prefix_caching"] is False
    assert meta["engine_settings"]["max_num_batched_tokens"] == 4096
    df = pd.read_csv(out / "profile.csv")
    grid = vllm_grid("test")
    assert len(df) == len(grid.probes) and (df["time_s"] > 0).all() and (df["reps"] > 0).all()
    for probe, row in zip(grid.probes, df.itertuples()):
        assert row.kind == probe.kind
        assert row.decode_rows == probe.decodes and row.batch_size == probe.decodes + (probe.chunk > 0)
        if probe.chunk:
            assert (row.q, row.c, row.num_segments) == (probe.chunk, probe.cached, 1)
            assert row.attn_units == probe.chunk * (probe.cached + probe.chunk / 2)
        assert row.sampled_tokens == probe.decodes + (probe.chunk > 0 and probe.sample)
        if probe.decodes:  # the middle timed step: every row near `context` (the first prefilled ran ahead)
            mean = row.decode_kv / row.decode_rows - 1
            assert abs(mean - probe.context) <= 8 and row.decode_pad_kv <= 8 * row.decode_rows
    report = fit_profile(out, plot=False)
    capsys.readouterr()
    assert {"decode", "prefill", "hybrid"} <= set(report.train) and report.holdout["overall"].n > 0
    assert np.isfinite(report.holdout["overall"].mape)
    fitted = Fitted.load(report.cost_model_path)
    assert fitted.meta["engine"] == "vllm" and min(fitted.coefficients.values()) >= 0
    # the fit reproduces its own rows; a step's fixed cost may land in overhead_s or in a curve's first knot
    # (both are non-negative least squares), so neither alone is asserted
    assert report.train["overall"].mape < 0.25
    # the model worker bound as serving binds it (one core kept for the engine core and the front end), and
    # the served stage's closed batches calibrate the fit's host terms
    assert meta["threads"] == max(1, meta["cpu_count"] - 1)
    served = meta["served_steps"]
    assert [s["batch"] for s in served] == list(grid.served)
    assert all(s["time_s"] > s["model_s"] > 0 and s["steps"] > 0 for s in served)
    assert fitted.step_overheads is not None and fitted.step_overheads.source.startswith("served")
    assert [r["batch"] for r in fitted.fit["served"]] == list(grid.served)
