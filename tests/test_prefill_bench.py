"""`simctl prefill-bench` (Prepacking's experiment): length profiles from its Table 2, the policies' own
prefill plans priced, and the command line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import simctl_here

from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.costs.roofline import Roofline
from simctl.studies.prefill_bench import PROFILES, bench, largest_batch, prefill_plans, prompt_lengths

pytestmark = pytest.mark.torch

SIMCTL = Path(sys.executable).parent / "simctl"


@pytest.mark.parametrize("name", list(PROFILES))
def test_profiles_follow_table_2(name: str) -> None:
    p = PROFILES[name]
    x = prompt_lengths(name, 1000, 0)
    assert p.min <= x.min() and x.max() <= p.max
    assert abs(x.mean() / p.mean - 1) < 0.12  # the closed-form fit ignores rounding and clipping
    assert x.max() > 0.6 * p.max  # a 1,000-prompt sample reaches near the table's max, as the paper's did


def test_prepacking_beats_full_batching_and_fits_larger_batches() -> None:
    spec, cost = get_model("sheared-llama-1.3b"), Roofline("sheared-llama-1.3b", "a6000")
    pool = prompt_lengths("mmlu", 512, 1)
    speedups = []
    for b in (8, 32):
        hf, lo, pp = (bench(p, pool, b, cost, spec)[0] for p in ("hf-padded", "length-ordered", "prepack"))
        assert hf.batches == pp.batches == lo.batches == -(-512 // b)
        assert hf.batch_reduction == lo.batch_reduction == 1 and pp.batch_reduction > 1
        assert pp.prefill_s < hf.prefill_s and lo.max_abs_deviation < hf.max_abs_deviation
        assert pp.peak_gib <= hf.peak_gib
        speedups.append(hf.prefill_s / pp.prefill_s)
    assert speedups[1] > speedups[0]  # larger batches: more padding to save (the paper's Section 4.5)
    memory = 24 * 2**30
    assert largest_batch("prepack", pool, spec, memory) >= largest_batch("hf-padded", pool, spec, memory) > 0


def test_length_ordered_batches_are_consecutive_in_length() -> None:
    pool = prompt_lengths("alpaca", 64, 2)
    plans = prefill_plans("length-ordered", pool, 16)
    assert [sorted(p.num_new) for p in plans] == [sorted(pool.tolist())[i:i + 16] for i in range(0, 64, 16)]


def test_policies_that_chunk_or_decode_are_refused() -> None:
    with pytest.raises(InputError, match="whole prompts"):
        prefill_plans("sarathi", prompt_lengths("hh-rlhf", 32, 0), 8)


def _simctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SIMCTL), "prefill-bench", *args], check=False, capture_output=True, text=True,
                          timeout=300)


def test_cli_json_and_out(tmp_path: Path) -> None:
    r = _simctl("--lengths", "alpaca", "--batch-size", "4,16", "--prompts", "64", "--json", "--out",
                str(tmp_path / "o"))
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert {(p["policy"], p["batch_size"]) for p in data["points"]} == {
        (p, b) for p in ("hf-padded", "length-ordered", "prepack") for b in (4, 16)}
    assert all(p["speedup_vs_hf_padded"] >= 1 for p in data["points"] if p["policy"] == "prepack")
    assert sorted(f.name for f in (tmp_path / "o").iterdir()) == ["prefill_bench.parquet", "summary.json"]


@pytest.mark.parametrize("args,text", [
    (("--batch-size", "8,x"), "--batch-size"), (("--batch-size", "0"), ">= 1"),
    (("--lengths", "nope"), "neither a profile"), (("--policy", "foo"), "unknown policy"),
    (("--policy", "sarathi", "--prompts", "16"), "whole prompts"), (("--scale", "0"), "--scale"),
])
def test_cli_bad_input_is_one_line(args: tuple[str, ...], text: str) -> None:
    r = simctl_here("prefill-bench", *args)
    assert r.returncode == 2 and text in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cli_real_times_the_plans_on_this_machine() -> None:
    pytest.importorskip("torch")
    r = _simctl("--lengths", "wikitext256", "--scale", "0.2", "--prompts", "24", "--batch-size", "8",
                "--model", "tiny", "--gpu", "cpu", "--real", "--real-batches", "1", "--repeats", "1",
                "--json")
    assert r.returncode == 0, r.stderr
    points = json.loads(r.stdout)["points"]
    assert all(p["real_prefill_s"] > 0 and p["predicted_first_s"] > 0 for p in points)
