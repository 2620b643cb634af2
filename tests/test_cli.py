"""The `simctl` command-line contract, exercised through the installed console script in a subprocess; bad
input, which the command refuses in-process, through `simctl.cli.main` in this process (`simctl_here`).

- Bad input: exit code 2, exactly one line on stderr starting with "simctl: error:", no traceback, nothing
  on stdout, and nothing written to --out (not even the folder; earlier runs' files untouched).
- `run --out DIR`: summary.json, requests.parquet, iterations.parquet and replicas.parquet, mutually
  consistent.
- `run --json`: only the summary JSON on stdout, equal to summary.json of the same run (bar wall time).
- Trace files replay their arrivals; a seed reproduces a run; `list` names the whole catalogue.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import simctl_here

pytestmark = pytest.mark.cli

SIMCTL = Path(sys.executable).parent / "simctl"
RUN_FILES = ("summary.json", "requests.parquet", "iterations.parquet", "replicas.parquet")  # 1 or N replicas
POLICY_NAMES = ("faster-transformer", "orca", "vllm", "sarathi", "sarathi-hybrid-only",
                "sarathi-chunked-only")
SUMMARY_KEYS = (
    "policy", "trace", "model", "gpu", "tp", "qps", "seed", "num_requests", "completed",
    "ttft_p50", "ttft_p90", "ttft_p99", "tbt_p50", "tbt_p90", "tbt_p99", "tpot_p50",
    "e2e_p50", "e2e_p90", "e2e_p99", "sched_delay_p50", "sched_delay_p99",
    "throughput_rps", "throughput_tokens_per_s", "makespan_s", "preemptions", "sim_wall_s",
)
REQUEST_COLUMNS = ("arrival_s", "first_scheduled_s", "first_token_s", "completion_s", "prompt_tokens",
                   "output_tokens", "preemptions")


def simctl(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SIMCTL), *map(str, args)], check=False, capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def assert_one_line_error(res: subprocess.CompletedProcess[str], *expected: str) -> str:
    """Exit 2, one non-empty 'simctl: error: ...' line on stderr, no traceback, nothing on stdout."""
    lines = res.stderr.splitlines()
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith("simctl: error: ") and line[len("simctl: error: "):].strip(), line
    assert "Traceback" not in res.stderr
    assert res.stdout == "", res.stdout
    for text in expected:
        assert text.lower() in line.lower(), (text, line)
    return line


def assert_no_outputs(out: Path) -> None:
    for name in RUN_FILES:
        assert not (out / name).exists(), name
    assert not out.exists() or not any(out.iterdir()), list(out.iterdir())


# ---------------------------------------------------------------- trace files


def write_csv(path: Path, rows: list[tuple], header: str = "num_prefill_tokens,num_decode_tokens,arrived_at"
              ) -> Path:
    path.write_text(header + "\n" + "".join(",".join(map(str, r)) + "\n" for r in rows))
    return path


def good_rows(n: int, seed: int = 0) -> list[tuple[int, int, str]]:
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.5, n))
    return [(int(rng.integers(16, 2000)), int(rng.integers(1, 200)), repr(float(a))) for a in arrivals]


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("traces")
    rows = good_rows(60)
    big = list(rows)
    big[10] = (500000, 10, big[10][2])
    t: dict[str, Path] = {
        "good": write_csv(d / "good.csv", rows),
        "big": write_csv(d / "big.csv", big),
        "negative": write_csv(d / "negative.csv", [(100, 10, 0.1), (-5, 10, 0.2)]),
        "zero": write_csv(d / "zero.csv", [(100, 0, 0.1)]),
        "fraction": write_csv(d / "fraction.csv", [(100, 10, 0.1), (12.5, 10, 0.2)]),
        "nan_length": write_csv(d / "nan_length.csv", [(100, "nan", 0.1)]),
        "nan_arrival": write_csv(d / "nan_arrival.csv", [(100, 10, 0.1), (100, 10, "NaN")]),
        "text_length": write_csv(d / "text_length.csv", [(100, "ten", 0.1)]),
        "unsorted": write_csv(d / "unsorted.csv", [(100, 10, 0.5), (100, 10, 0.2)]),
        "negative_arrival": write_csv(d / "negative_arrival.csv", [(100, 10, -1.0)]),
        "missing_column": write_csv(d / "missing_column.csv", [(100, 0.1)],
                                    header="num_prefill_tokens,arrived_at"),
        "header_only": write_csv(d / "header_only.csv", []),
        "empty_csv": d / "empty.csv",
        "empty_jsonl": d / "empty.jsonl",
        "bad_jsonl": d / "bad.jsonl",
        "string_jsonl": d / "string.jsonl",
        "good_jsonl": d / "good.jsonl",
        "txt": d / "trace.txt",
    }
    t["empty_csv"].write_text("")
    t["empty_jsonl"].write_text("\n\n")
    t["bad_jsonl"].write_text('{"prompt_tokens": 10, "output_tokens": 5}\n{"prompt_tokens": 10,\n')
    t["string_jsonl"].write_text('{"prompt_tokens": "10", "output_tokens": 5}\n')
    t["good_jsonl"].write_text("".join(
        json.dumps({"prompt_tokens": p, "output_tokens": o, "arrival_s": float(a)}) + "\n"
        for p, o, a in rows))
    t["txt"].write_text("num_prefill_tokens,num_decode_tokens\n10,10\n")
    return t


# ---------------------------------------------------------------- bad input

SMALL = ("--num-requests", "50")

# (id, run arguments, substrings the error line must contain: the bad value and / or what is allowed)
BAD_RUNS: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("unknown-policy", ("--policy", "foo", *SMALL), ("'foo'", "vllm", "sarathi", "faster-transformer")),
    ("unknown-trace", ("--trace", "foo", *SMALL), ("'foo'", "sharegpt", "arxiv")),
    ("empty-trace", ("--trace", "", *SMALL), ("--trace", "sharegpt")),
    ("unknown-model", ("--model", "gpt-9", *SMALL), ("'gpt-9'", "mistral-7b")),
    ("unknown-gpu", ("--gpu", "tpu-v9", *SMALL), ("'tpu-v9'", "a100-80gb")),
    ("qps-zero", ("--qps", "0", *SMALL), ("--qps", "0", "> 0")),
    ("qps-negative", ("--qps", "-1", *SMALL), ("--qps", "-1")),
    ("scale-zero", ("--scale", "0", *SMALL), ("--scale", "> 0")),
    ("scale-text", ("--scale", "tiny", *SMALL), ("--scale", "tiny")),
    ("qps-nan", ("--qps", "nan", *SMALL), ("--qps", "nan")),
    ("qps-inf", ("--qps", "inf", *SMALL), ("--qps", "inf")),
    ("qps-too-low", ("--qps", "1e-300", *SMALL), ("--qps", "1e-300")),
    ("num-requests-zero", ("--num-requests", "0"), ("--num-requests", "got 0")),
    ("num-requests-negative", ("--num-requests", "-3"), ("--num-requests", "-3")),
    ("num-requests-huge", ("--num-requests", "1000000000000"), ("--num-requests", "1000000000000")),
    ("tp-zero", ("--tp", "0", *SMALL), ("--tp", "got 0")),
    ("tp-not-dividing-heads", ("--tp", "3", *SMALL), ("tp=3", "32")),
    ("token-budget-non-sarathi", ("--policy", "vllm", "--token-budget", "512", *SMALL),
     ("--token-budget", "'vllm'", "sarathi")),
    ("token-budget-zero", ("--policy", "sarathi", "--token-budget", "0", *SMALL),
     ("--token-budget", "got 0")),
    ("max-batch-size-zero", ("--max-batch-size", "0", *SMALL), ("--max-batch-size", "got 0")),
    ("seed-negative", ("--seed", "-1", *SMALL), ("--seed", "-1")),
    ("unknown-arrival", ("--arrival", "uniform", *SMALL), ("'uniform'", "poisson", "gamma")),
    ("cv-with-poisson", ("--cv", "2", *SMALL), ("--cv", "gamma")),
    ("cv-zero", ("--arrival", "gamma", "--cv", "0", *SMALL), ("--cv", "0")),
    ("model-too-big-for-gpu", ("--model", "llama-2-70b", "--gpu", "l4", *SMALL),
     ("does not fit", "llama-2-70b", "l4")),
    ("model-too-big-tp", ("--model", "falcon-180b", "--gpu", "a100-80gb", "--tp", "2", *SMALL),
     ("does not fit", "falcon-180b")),
    # wrong types, unknown options and commands: click / typer usage errors, one line too
    ("qps-not-a-number", ("--qps", "abc", *SMALL), ("'abc'", "--qps", "number")),
    ("qps-equals-not-a-number", ("--qps=abc", *SMALL), ("'abc'", "--qps")),
    ("tp-not-an-integer", ("--tp", "1.5", *SMALL), ("'1.5'", "--tp", "integer")),
    ("num-requests-not-an-integer", ("--num-requests", "ten"), ("'ten'", "--num-requests")),
    ("unknown-option", ("--bogus", *SMALL), ("--bogus", "simctl run --help")),
    ("option-missing-value", (*SMALL, "--qps"), ("--qps",)),
    ("flag-with-value", ("--json=yes", *SMALL), ("--json",)),
    ("extra-argument", ("extra", *SMALL), ("extra",)),
]

# (id, trace fixture key, extra arguments, substrings)
BAD_TRACES: list[tuple[str, str, tuple[str, ...], tuple[str, ...]]] = [
    ("negative-length", "negative", (), ("negative.csv", "line 3", "num_prefill_tokens", "-5", ">= 1")),
    ("zero-length", "zero", (), ("zero.csv", "line 2", "num_decode_tokens", ">= 1")),
    ("non-integer-length", "fraction", (), ("fraction.csv", "line 3", "12.5", "integer")),
    ("nan-length", "nan_length", (), ("nan_length.csv", "line 2", "num_decode_tokens", "nan")),
    ("nan-arrival", "nan_arrival", (), ("nan_arrival.csv", "line 3", "arrived_at", "nan")),
    ("text-length", "text_length", (), ("text_length.csv", "'ten'", "not a number")),
    ("unsorted-arrivals", "unsorted", (), ("unsorted.csv", "line 3", "sorted")),
    ("negative-arrival", "negative_arrival", (), ("negative_arrival.csv", "arrived_at", "-1")),
    ("missing-column", "missing_column", (), ("missing_column.csv", "missing", "num_decode_tokens")),
    ("header-only", "header_only", (), ("header_only.csv", "no requests")),
    ("empty-csv", "empty_csv", (), ("empty.csv", "empty")),
    ("empty-jsonl", "empty_jsonl", (), ("empty.jsonl", "empty")),
    ("malformed-jsonl", "bad_jsonl", (), ("bad.jsonl", "line 2", "invalid json")),
    ("string-length-jsonl", "string_jsonl", (), ("string.jsonl", "prompt_tokens", "not a number")),
    ("unsupported-extension", "txt", (), ("trace.txt", ".csv", ".jsonl")),
    ("more-requests-than-rows", "good", ("--num-requests", "100"), ("good.csv", "100", "60")),
    ("request-beyond-the-context", "big", ("--policy", "vllm", "--on-too-long", "error"),
     ("request 10", "500000 prompt", "mistral-7b has a context of 32768")),
]


@pytest.mark.parametrize(("args", "expected"), [c[1:] for c in BAD_RUNS], ids=[c[0] for c in BAD_RUNS])
def test_bad_option_is_one_line_exit_2_and_writes_nothing(
        tmp_path: Path, args: tuple[str, ...], expected: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    assert_one_line_error(simctl_here("run", *args, "--out", out, cwd=tmp_path), *expected)
    assert_no_outputs(out)
    assert not out.exists()


@pytest.mark.parametrize(("key", "args", "expected"), [c[1:] for c in BAD_TRACES],
                         ids=[c[0] for c in BAD_TRACES])
def test_bad_trace_is_one_line_exit_2_and_writes_nothing(
        tmp_path: Path, traces: dict[str, Path], key: str, args: tuple[str, ...],
        expected: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    res = simctl_here("run", "--trace", traces[key], *args, "--out", out, "--json", cwd=tmp_path)
    assert_one_line_error(res, *expected)
    assert_no_outputs(out)
    assert not out.exists()


def test_missing_trace_file(tmp_path: Path) -> None:
    """Through the console script: exit code 2, one line on stderr, no traceback, nothing written."""
    res = simctl("run", "--trace", tmp_path / "nope.csv", *SMALL, "--out", tmp_path / "out")
    assert_one_line_error(res, "nope.csv", "not found")
    assert not (tmp_path / "out").exists()


def test_out_is_an_existing_file(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.write_text("keep me")
    assert_one_line_error(simctl_here("run", *SMALL, "--out", out), "--out", "not a directory")
    assert out.read_text() == "keep me"
    assert_one_line_error(simctl_here("run", *SMALL, "--out", out / "sub"), "--out", "not a directory")


@pytest.mark.parametrize(("args", "words"), [
    (("--repeats", "0"), ("--repeats", "1 to 20")),
    (("--loads", "half"), ("--loads", "comma-separated")),
    (("--policy", "nope"), ("unknown policy",)),
])
def test_validate_bad_option_is_one_line_exit_2(tmp_path: Path,
                                                args: tuple[str, ...], words: tuple[str, ...]) -> None:
    res = simctl_here("validate", *args, "--out", tmp_path / "val")
    assert_one_line_error(res, *words)
    assert not (tmp_path / "val").exists()


def test_scale_shrinks_lengths_as_simctl_real_does(tmp_path: Path) -> None:
    """--scale is part of the trace spec: lengths scaled (rounded, >= 1), arrivals kept, recorded."""
    full, small = tmp_path / "full", tmp_path / "small"
    for out, extra in ((full, ()), (small, ("--scale", "0.1"))):
        res = simctl("run", "--policy", "vllm", "--trace", "sharegpt", "--num-requests", "40", "--qps", "2",
                     *extra, "--out", out)
        assert res.returncode == 0, res.stderr
    a, b = (pd.read_parquet(d / "requests.parquet").sort_values("request_id") for d in (full, small))
    assert b["arrival_s"].tolist() == a["arrival_s"].tolist()
    assert b["prompt_tokens"].tolist() == [max(1, math.floor(n * 0.1 + 0.5)) for n in a["prompt_tokens"]]
    assert json.loads((small / "summary.json").read_text())["scale"] == 0.1


def test_unknown_command() -> None:
    assert_one_line_error(simctl("frobnicate"), "frobnicate")
    assert_one_line_error(simctl("list", "--bogus"), "--bogus", "simctl list --help")


def test_failed_run_leaves_earlier_outputs_untouched(tmp_path: Path,
                                                    traces: dict[str, Path]) -> None:
    out = tmp_path / "out"
    res = simctl_here("run", "--policy", "vllm", "--trace", "sharegpt", "--qps", "4", *SMALL, "--out", out)
    assert res.returncode == 0, res.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == sorted(RUN_FILES)
    for bad in (("--qps", "0"), ("--policy", "nope"), ("--qps", "abc"), ("--trace", str(traces["unsorted"])),
                ("--trace", str(traces["big"]), "--on-too-long", "error"),
                ("--model", "llama-2-70b", "--gpu", "l4")):
        assert_one_line_error(simctl_here("run", "--policy", "vllm", *SMALL, *bad, "--out", out))
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # same files, same bytes, no temps


def test_write_run_is_all_or_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A failure while writing (here: the second parquet file) leaves no new file and no temporary file."""
    from simctl.results.output import write_run

    out = tmp_path / "out"
    frame = pd.DataFrame({"a": [1, 2]})
    write_run(out, {"x": 1}, frame, frame)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["iterations.parquet", "requests.parquet", "summary.json"]

    class Boom(Exception):
        pass

    def fail(*_a: object, **_k: object) -> None:
        raise Boom

    bad = pd.DataFrame({"b": [3]})
    monkeypatch.setattr(bad, "to_parquet", fail)
    with pytest.raises(Boom):
        write_run(out, {"x": 2}, pd.DataFrame({"a": [9]}), bad)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    with pytest.raises(ValueError):  # NaN in the summary: refused before anything is written
        write_run(out, {"x": math.nan}, frame, frame)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before


# ---------------------------------------------------------------- good runs

GOOD = ("--policy", "sarathi", "--trace", "sharegpt", "--model", "mistral-7b", "--gpu", "a100-80gb",
        "--tp", "1", "--qps", "3", "--num-requests", "150", "--seed", "7", "--token-budget", "1024",
        "--max-batch-size", "64")


@pytest.fixture(scope="module")
def good_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    d = tmp_path_factory.mktemp("good")
    table = simctl("run", *GOOD, "--out", d / "out")
    assert table.returncode == 0, table.stderr
    as_json = simctl("run", *GOOD, "--json")
    assert as_json.returncode == 0, as_json.stderr
    return {
        "out": d / "out",
        "table": table,
        "json": as_json,
        "summary": json.loads((d / "out" / "summary.json").read_text()),
        "requests": pd.read_parquet(d / "out" / "requests.parquet"),
        "iterations": pd.read_parquet(d / "out" / "iterations.parquet"),
    }


def test_out_writes_the_three_files(good_run: dict) -> None:
    assert sorted(p.name for p in good_run["out"].iterdir()) == sorted(RUN_FILES)  # and no temporary files
    assert "ttft" in good_run["table"].stdout and good_run["table"].stderr == ""


def test_summary_has_the_contract_keys_and_echoes_the_config(good_run: dict) -> None:
    s = good_run["summary"]
    missing = [k for k in SUMMARY_KEYS if k not in s]
    assert not missing
    assert (s["policy"], s["trace"], s["model"], s["gpu"], s["tp"], s["qps"], s["seed"],
            s["num_requests"]) == ("sarathi", "sharegpt", "mistral-7b", "a100-80gb", 1, 3.0, 7, 150)
    assert s["token_budget"] == 1024 and s["max_batch_size"] == 64
    assert s["completed"] == 150
    for name in ("ttft", "tbt", "e2e"):
        assert 0 <= s[f"{name}_p50"] <= s[f"{name}_p90"] <= s[f"{name}_p99"]
    assert s["sim_wall_s"] > 0 and s["makespan_s"] > 0


def test_requests_parquet_agrees_with_summary(good_run: dict) -> None:
    s, r = good_run["summary"], good_run["requests"]
    assert len(r) == s["num_requests"] == 150
    assert set(REQUEST_COLUMNS) <= set(r.columns)
    done = r[r["completion_s"] >= 0]
    assert len(done) == s["completed"]
    assert (done["first_scheduled_s"] >= done["arrival_s"]).all()
    assert (done["first_token_s"] >= done["first_scheduled_s"]).all()
    assert (done["completion_s"] >= done["first_token_s"]).all()
    ttft = (done["first_token_s"] - done["arrival_s"]).to_numpy()
    e2e = (done["completion_s"] - done["arrival_s"]).to_numpy()
    sched = (r["first_scheduled_s"] - r["arrival_s"])[r["first_scheduled_s"] >= 0].to_numpy()
    for p in (50, 90, 99):
        assert s[f"ttft_p{p}"] == pytest.approx(np.percentile(ttft, p), rel=1e-9, abs=1e-12)
        assert s[f"e2e_p{p}"] == pytest.approx(np.percentile(e2e, p), rel=1e-9, abs=1e-12)
    for p in (50, 99):
        assert s[f"sched_delay_p{p}"] == pytest.approx(np.percentile(sched, p), rel=1e-9, abs=1e-12)
    multi = done[done["output_tokens"] > 1]
    tpot = (multi["completion_s"] - multi["first_token_s"]) / (multi["output_tokens"] - 1)
    assert s["tpot_p50"] == pytest.approx(float(np.median(tpot)), rel=1e-9)
    makespan = done["completion_s"].max() - r["arrival_s"].min()
    assert s["makespan_s"] == pytest.approx(makespan, rel=1e-9)
    assert s["throughput_rps"] == pytest.approx(len(done) / makespan, rel=1e-9)
    assert s["throughput_tokens_per_s"] == pytest.approx(done["output_tokens"].sum() / makespan, rel=1e-9)
    assert s["preemptions"] == r["preemptions"].sum()


def test_iterations_parquet_accounts_for_every_token(good_run: dict) -> None:
    s, r, it = good_run["summary"], good_run["requests"], good_run["iterations"]
    check_token_accounting(r, it)
    assert it["count"].sum() == s["iterations"]
    assert (it["duration_s"] > 0).all() and (it["count"] >= 1).all()
    assert it["start_s"].is_monotonic_increasing
    assert it["kv_used_tokens"].max() == s["kv_peak_tokens"] <= s["kv_capacity_tokens"]


def check_token_accounting(r: pd.DataFrame, it: pd.DataFrame) -> None:
    """Every prompt token is prefilled and every output token after the first comes from a decode step,
    except that a preempted request recomputes its context in a prefill that also yields its next token."""
    prefill = int(it["prefill_tokens"].sum())
    decode = int((it["count"] * it["decode_tokens"]).sum())
    prompts, later_outputs = int(r["prompt_tokens"].sum()), int((r["output_tokens"] - 1).sum())
    preemptions = int(r["preemptions"].sum())
    assert prefill >= prompts
    assert later_outputs - preemptions <= decode <= later_outputs
    assert prefill + decode >= prompts + later_outputs
    if preemptions == 0:
        assert prefill == prompts and decode == later_outputs


def test_token_accounting_with_preemptions(tmp_path: Path) -> None:
    """A small KV cache (Mistral-7B on a 24 GB L4) under load makes vLLM preempt."""
    out = tmp_path / "out"
    res = simctl("run", "--policy", "vllm", "--trace", "sharegpt", "--gpu", "l4", "--qps", "0.5",
                 "--num-requests", "200", "--seed", "0", "--out", out, "--json")
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    r, it = pd.read_parquet(out / "requests.parquet"), pd.read_parquet(out / "iterations.parquet")
    assert s["preemptions"] == r["preemptions"].sum() > 0
    check_token_accounting(r, it)


def test_json_is_the_only_stdout_and_equals_summary_json(good_run: dict) -> None:
    res = good_run["json"]
    assert res.stderr == ""
    printed = json.loads(res.stdout)  # the whole of stdout is one JSON document
    written = dict(good_run["summary"])
    assert printed.pop("sim_wall_s") > 0
    written.pop("sim_wall_s")
    assert printed == written


def test_json_with_out_prints_exactly_what_it_writes(tmp_path: Path) -> None:
    res = simctl("run", "--policy", "orca", "--trace", "arxiv", "--qps", "1", "--num-requests", "60",
                 "--out", tmp_path / "o", "--json")
    assert res.returncode == 0, res.stderr
    assert res.stdout == (tmp_path / "o" / "summary.json").read_text()


def test_same_seed_same_summary_other_seed_differs(good_run: dict) -> None:
    again = simctl("run", *GOOD, "--json")
    assert again.returncode == 0, again.stderr
    a, b = json.loads(good_run["json"].stdout), json.loads(again.stdout)
    a.pop("sim_wall_s")
    b.pop("sim_wall_s")
    assert a == b
    other = simctl("run", *GOOD[:-6], "--seed", "8", *GOOD[-4:], "--json")
    assert other.returncode == 0, other.stderr
    c = json.loads(other.stdout)
    assert c["seed"] == 8 and c["ttft_p50"] != a["ttft_p50"]


@pytest.mark.parametrize("key", ["good", "good_jsonl"])
def test_trace_file_replays_its_arrivals(tmp_path: Path, traces: dict[str, Path], key: str) -> None:
    rows = good_rows(60)
    out = tmp_path / "out"
    # no --num-requests: every row of the file; no --qps: its arrival times as they are
    res = simctl("run", "--policy", "orca", "--trace", traces[key], "--out", out, "--json")
    assert res.returncode == 0, res.stderr
    s = json.loads(res.stdout)
    assert s["trace"] == str(traces[key]) and s["num_requests"] == 60
    assert s["qps"] is None and s["arrivals_from_file"] is True
    r = pd.read_parquet(out / "requests.parquet")
    np.testing.assert_allclose(r["arrival_s"], [float(a) for _, _, a in rows], rtol=1e-15, atol=0)
    np.testing.assert_array_equal(r["prompt_tokens"], [p for p, _, _ in rows])
    np.testing.assert_array_equal(r["output_tokens"], [o for _, o, _ in rows])
    check_token_accounting(r, pd.read_parquet(out / "iterations.parquet"))


def test_trace_file_num_requests_takes_the_first_rows(tmp_path: Path, traces: dict[str, Path]) -> None:
    out = tmp_path / "out"
    res = simctl("run", "--policy", "vllm", "--trace", traces["good"], "--num-requests", "25", "--out", out)
    assert res.returncode == 0, res.stderr
    r = pd.read_parquet(out / "requests.parquet")
    np.testing.assert_allclose(r["arrival_s"], [float(a) for _, _, a in good_rows(60)[:25]], rtol=1e-15)


# ---------------------------------------------------------------- list and help


def test_list_names_the_catalogue() -> None:
    from simctl.policies.registry import POLICIES

    res = simctl("list")
    assert res.returncode == 0 and res.stderr == ""
    for name in (*POLICY_NAMES, *POLICIES, "sharegpt", "arxiv", "mistral-7b", "a100-80gb"):
        assert name in res.stdout, name
    # piped: the tables take simctl's piped width, not rich's 80 columns that fold the policies' summaries
    from simctl.display import PIPED_WIDTH

    assert 80 < max(len(line) for line in res.stdout.splitlines()) <= PIPED_WIDTH


def test_help_still_works() -> None:
    for args in (("--help",), ("run", "--help"), ("list", "--help"), ()):
        res = simctl(*args)
        assert res.returncode == 0, (args, res.stderr)
        assert "Usage" in res.stdout and res.stderr == "", args
    assert "--policy" in simctl("run", "--help").stdout


# the other commands: (id, arguments, substrings); every one writes nothing into its --out
BAD_OTHER: list[tuple[str, tuple[str, ...], tuple[str, ...]]] = [
    ("real-unknown-policy", ("real", "--policy", "foo"), ("'foo'", "vllm")),
    ("real-scale-zero", ("real", "--scale", "0"), ("--scale",)),
    ("real-cuda-missing", ("real", "--device", "cuda", "--num-requests", "2", "--scale", "0.01"), ("cuda",)),
    ("profile-unknown-model", ("profile", "--model", "gpt-9"), ("'gpt-9'",)),
    ("profile-bad-dtype", ("profile", "--dtype", "int3"), ("int3",)),
    ("fit-missing-profile", ("fit", "no/such/profile"), ("no/such/profile",)),
    ("run-missing-cost", ("run", "--cost", "no/such/cost_model.json", "--num-requests", "10"),
     ("no/such/cost_model.json",)),
    ("capacity-unknown-policy", ("capacity", "--policy", "vllm,foo"), ("'foo'",)),
]


@pytest.mark.parametrize(("args", "expected"), [c[1:] for c in BAD_OTHER], ids=[c[0] for c in BAD_OTHER])
def test_other_commands_bad_input_is_one_line_exit_2(
        tmp_path: Path, args: tuple[str, ...], expected: tuple[str, ...]) -> None:
    out = tmp_path / "out"
    assert_one_line_error(simctl_here(*args, "--out", out, cwd=tmp_path), *expected)
    assert not out.exists() or not any(out.iterdir())


def test_roofline_calibration_of_the_cpu_prices_the_cpu_only(tmp_path: Path) -> None:
    """`simctl fit --roofline-gpu` on the shipped CPU profile, then `run --cost` with that calibration: on the
    CPU it prices; on a GPU (the README's old example predicted Mistral-7B on an A100 at 77 s per token) it is
    refused, and so is calibrating a CPU profile against a GPU's specs."""
    shipped = Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu"
    assert_one_line_error(simctl("fit", shipped, "--out", tmp_path / "gpu", "--roofline-gpu", "a100-80gb"),
                          "--roofline-gpu a100-80gb", "--roofline-gpu cpu")
    assert not (tmp_path / "gpu").exists()
    res = simctl("fit", shipped, "--out", tmp_path / "fit", "--roofline-gpu", "cpu")
    assert res.returncode == 0, res.stderr
    calib = tmp_path / "fit" / "roofline_calibration.json"
    assert json.loads(calib.read_text())["measured_on"] == "cpu"
    cpu = ("run", "--model", "tiny", "--gpu", "cpu", "--trace", "sharegpt", "--scale", "0.05",
           "--num-requests", "50", "--json")
    res = simctl(*cpu, "--cost", calib)
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["cost_model"].startswith("roofline calibrated by") and summary["warnings"] == []
    assert summary["ttft_p50"] != json.loads(simctl(*cpu).stdout)["ttft_p50"]  # not the shipped fit
    for gpu in ("a100-80gb", "h100"):
        assert_one_line_error(simctl("run", "--gpu", gpu, "--cost", calib, "--num-requests", "10"),
                              "measured on a CPU", f"cannot price {gpu}")
    assert_one_line_error(simctl("run", "--gpu", "a100-80gb", "--model", "tiny", "--cost",
                                 shipped / "cost_model.json", "--num-requests", "10"),
                          "fitted on", "not a100-80gb's", "--gpu cpu")
