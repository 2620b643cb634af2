"""traces/: arrival generators, Table-2 length profiles, file loaders and build_trace."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from simctl.common.errors import InputError
from simctl.traces import (
    PROFILES,
    Request,
    build_trace,
    gamma_arrivals,
    load_trace_file,
    poisson_arrivals,
    sample_lengths,
    trace_max_total_tokens,
)
from simctl.traces.lengths import PAPER_QUANTILES, SHAREGPT_SPEARMAN

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "traces"
SHAREGPT_REAL = REFERENCE / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
SPLITWISE_CONV = REFERENCE / "splitwise_conv.csv"

N_SAMPLES = 100_000


@pytest.fixture(scope="module")
def samples() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    return {name: sample_lengths(name, N_SAMPLES, np.random.default_rng(123)) for name in PROFILES}


# ---------------------------------------------------------------- length profiles


@pytest.mark.parametrize("name", sorted(PAPER_QUANTILES))
def test_generated_median_and_p90_match_table2(samples, name: str) -> None:
    prompts, outputs = samples[name]
    p_med, p_p90, o_med, o_p90 = PAPER_QUANTILES[name]
    got = {
        "prompt median": (np.median(prompts), p_med),
        "prompt P90": (np.quantile(prompts, 0.9), p_p90),
        "output median": (np.median(outputs), o_med),
        "output P90": (np.quantile(outputs, 0.9), o_p90),
    }
    for what, (value, table) in got.items():
        assert abs(value / table - 1) < 0.05, f"{name} {what}: generated {value}, Table 2 {table}"


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_lengths_are_positive_ints_under_the_cap(samples, name: str) -> None:
    prompts, outputs = samples[name]
    assert prompts.dtype == np.int64 and outputs.dtype == np.int64
    assert len(prompts) == len(outputs) == N_SAMPLES
    assert prompts.min() >= 1 and outputs.min() >= 1
    assert (prompts + outputs).max() <= PROFILES[name].max_total_tokens
    # The cap binds (the profile is truncated, not merely below it).
    assert (prompts + outputs).max() > 0.95 * PROFILES[name].max_total_tokens


def test_sharegpt_prompt_output_rank_correlation(samples) -> None:
    prompts, outputs = samples["sharegpt"]
    rho = stats.spearmanr(prompts, outputs).statistic
    assert abs(rho - SHAREGPT_SPEARMAN) < 0.015


def test_profiles_have_name_description_and_cap() -> None:
    assert set(PROFILES) == {"sharegpt", "arxiv"}
    for name, prof in PROFILES.items():
        assert prof.name == name
        assert prof.description and "\n" not in prof.description
    assert PROFILES["sharegpt"].max_total_tokens == 8192
    assert PROFILES["arxiv"].max_total_tokens == 16384


def test_sample_lengths_is_deterministic_for_a_seed() -> None:
    a = sample_lengths("sharegpt", 1000, np.random.default_rng(7))
    b = sample_lengths("sharegpt", 1000, np.random.default_rng(7))
    c = sample_lengths("sharegpt", 1000, np.random.default_rng(8))
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(PROFILES)), n=st.integers(0, 300), seed=st.integers(0, 2**32 - 1))
def test_sample_lengths_any_size(name: str, n: int, seed: int) -> None:
    prompts, outputs = sample_lengths(name, n, np.random.default_rng(seed))
    assert len(prompts) == len(outputs) == n
    assert prompts.dtype == np.int64 and outputs.dtype == np.int64
    if n:
        assert prompts.min() >= 1 and outputs.min() >= 1
        assert (prompts + outputs).max() <= PROFILES[name].max_total_tokens


def test_sample_lengths_rejects_bad_input() -> None:
    with pytest.raises(InputError, match="arxiv, sharegpt"):
        sample_lengths("lmsys", 10, np.random.default_rng(0))
    with pytest.raises(InputError):
        sample_lengths("sharegpt", -1, np.random.default_rng(0))


# ---------------------------------------------------------------- arrivals


def _cv(x: np.ndarray) -> float:
    return float(np.std(x) / np.mean(x))


def test_poisson_rate_and_cv() -> None:
    qps = 4.0
    t = poisson_arrivals(200_000, qps, np.random.default_rng(1))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert t[0] > 0  # documented convention: the first request arrives after the first gap
    assert np.all(gaps >= 0)
    assert abs(len(t) / t[-1] / qps - 1) < 0.02
    assert abs(_cv(gaps) - 1) < 0.02


@pytest.mark.parametrize("cv", [0.25, 0.5, 2.0, 4.0])
def test_gamma_mean_rate_and_cv(cv: float) -> None:
    qps = 10.0
    t = gamma_arrivals(200_000, qps, cv, np.random.default_rng(2))
    gaps = np.diff(np.concatenate([[0.0], t]))
    assert np.all(gaps >= 0)
    assert abs(np.mean(gaps) * qps - 1) < 0.03
    assert abs(_cv(gaps) / cv - 1) < 0.05


def test_gamma_with_cv_1_is_the_poisson_stream() -> None:
    a = gamma_arrivals(1000, 3.0, 1.0, np.random.default_rng(5))
    b = poisson_arrivals(1000, 3.0, np.random.default_rng(5))
    np.testing.assert_allclose(a, b, rtol=1e-12)


@given(qps=st.one_of(st.floats(max_value=0.0), st.just(math.inf), st.just(math.nan)))
def test_arrivals_reject_bad_qps(qps: float) -> None:
    with pytest.raises(InputError, match="qps"):
        poisson_arrivals(10, qps, np.random.default_rng(0))
    with pytest.raises(InputError, match="qps"):
        gamma_arrivals(10, qps, 1.5, np.random.default_rng(0))


@given(cv=st.one_of(st.floats(max_value=0.0), st.just(math.inf), st.just(math.nan)))
def test_gamma_rejects_bad_cv(cv: float) -> None:
    with pytest.raises(InputError, match="cv"):
        gamma_arrivals(10, 1.0, cv, np.random.default_rng(0))


# ---------------------------------------------------------------- loaders


def _write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_csv_without_arrivals_ignores_other_columns(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", "num_prefill_tokens,num_decode_tokens,pd_ratio\n10,5,2.0\n\n7,3.0,2.3\n")
    trace = load_trace_file(path)
    assert trace.prompt_tokens.tolist() == [10, 7] and trace.output_tokens.tolist() == [5, 3]
    assert trace.prompt_tokens.dtype == np.int64
    assert trace.arrival_s is None and not trace.has_arrivals and len(trace) == 2


def test_csv_with_arrivals_keeps_them(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "t.CSV", "arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,10,5\n0.5,7,3\n0.5,1,1\n"
    )
    trace = load_trace_file(path)
    assert trace.arrival_s is not None and trace.arrival_s.tolist() == [0.0, 0.5, 0.5]
    assert trace.prompt_tokens.tolist() == [10, 7, 1]


def test_jsonl_with_and_without_arrivals(tmp_path: Path) -> None:
    path = _write(
        tmp_path,
        "t.jsonl",
        '{"prompt_tokens": 12, "output_tokens": 4, "arrival_s": 0.1, "text": "hi"}\n\n'
        '{"prompt_tokens": 3.0, "output_tokens": 9, "arrival_s": 2}\n',
    )
    trace = load_trace_file(path)
    assert trace.prompt_tokens.tolist() == [12, 3] and trace.output_tokens.tolist() == [4, 9]
    assert trace.arrival_s is not None and trace.arrival_s.tolist() == [0.1, 2.0]
    path = _write(tmp_path, "u.jsonl", '{"prompt_tokens": 12, "output_tokens": 4}\n')
    assert load_trace_file(path).arrival_s is None


HEADER = "num_prefill_tokens,num_decode_tokens\n"
HEADER_ARR = "arrived_at,num_prefill_tokens,num_decode_tokens\n"
J = '{"prompt_tokens": 5, "output_tokens": 5}\n'

BAD_FILES = [
    ("x.txt", "a,b\n1,2\n", ["unsupported extension '.txt'"]),
    ("noext", "a\n", ["unsupported extension"]),
    ("e.csv", "", ["empty file"]),
    ("h.csv", HEADER, ["no requests"]),
    (
        "c.csv",
        "num_prefill_tokens,foo\n1,2\n",
        ["missing column", "num_decode_tokens", "found: num_prefill_tokens, foo"],
    ),
    ("f.csv", HEADER + "10,5\n3.5,2\n", ["line 3", "num_prefill_tokens", "integer"]),
    ("z.csv", HEADER + "10,0\n", ["line 2", "num_decode_tokens is 0", ">= 1"]),
    ("n.csv", HEADER + "-4,3\n", ["line 2", "num_prefill_tokens is -4"]),
    ("nan.csv", HEADER + "10,5\n\n10,nan\n", ["line 4", "num_decode_tokens", "not a number"]),
    ("inf.csv", HEADER + "inf,5\n", ["line 2", "num_prefill_tokens is inf"]),
    ("s.csv", HEADER + "10,5\n12,abc\n", ["line 3", "'abc', not a number"]),
    ("m.csv", HEADER + "10,\n", ["line 2", "num_decode_tokens is empty"]),
    ("big.csv", HEADER + "1e40,5\n", ["line 2", "larger than"]),
    ("p.csv", HEADER + "1,2\n1,2,3,4\n", ["malformed CSV"]),
    ("a.csv", HEADER_ARR + "0,1,1\n-1,1,1\n", ["line 3", "arrived_at is -1.0", ">= 0"]),
    ("ai.csv", HEADER_ARR + "0,1,1\ninf,1,1\n", ["line 3", "arrived_at is inf"]),
    ("as.csv", HEADER_ARR + "0,1,1\n2,1,1\n1.5,1,1\n", ["line 4", "earlier than 2.0 on line 3", "sorted"]),
    ("e.jsonl", "\n\n", ["empty file"]),
    ("j.jsonl", J + "{prompt_tokens: 5}\n", ["line 2", "invalid JSON"]),
    ("l.jsonl", "[5, 5]\n", ["line 1", "expected a JSON object"]),
    ("k.jsonl", J + '{"prompt_tokens": 5}\n', ["line 2", "missing key 'output_tokens'"]),
    (
        "b.jsonl",
        '{"prompt_tokens": true, "output_tokens": 5}\n',
        ["line 1", "prompt_tokens is True, not a number"],
    ),
    ("t.jsonl", '{"prompt_tokens": "5", "output_tokens": 5}\n', ["line 1", "not a number"]),
    (
        "fl.jsonl",
        '{"prompt_tokens": 5, "output_tokens": 2.5}\n',
        ["line 1", "output_tokens is 2.5", "integer"],
    ),
    ("zz.jsonl", '{"prompt_tokens": 5, "output_tokens": 0}\n', ["line 1", ">= 1"]),
    ("nn.jsonl", '{"prompt_tokens": NaN, "output_tokens": 1}\n', ["line 1", "prompt_tokens is nan"]),
    ("hg.jsonl", '{"prompt_tokens": 1' + "0" * 400 + ', "output_tokens": 1}\n', ["line 1", "out of range"]),
    (
        "mx.jsonl",
        '{"prompt_tokens": 5, "output_tokens": 5, "arrival_s": 0}\n' + J,
        ["line 2", "lacks 'arrival_s'"],
    ),
    (
        "un.jsonl",
        (
            '{"prompt_tokens": 5, "output_tokens": 5, "arrival_s": 3}\n\n'
            '{"prompt_tokens": 5, "output_tokens": 5, "arrival_s": 1}\n'
        ),
        ["line 3", "earlier than 3.0 on line 1"],
    ),
    (
        "ng.jsonl",
        '{"prompt_tokens": 5, "output_tokens": 5, "arrival_s": -0.5}\n',
        ["line 1", "arrival_s is -0.5"],
    ),
]


@pytest.mark.parametrize(("name", "text", "expected"), BAD_FILES, ids=[b[0] for b in BAD_FILES])
def test_bad_trace_files_raise_one_line_input_error(
    tmp_path: Path, name: str, text: str, expected: list[str]
) -> None:
    path = _write(tmp_path, name, text)
    with pytest.raises(InputError) as info:
        load_trace_file(path)
    msg = str(info.value)
    assert "\n" not in msg and str(path) in msg
    for part in expected:
        assert part in msg


def test_missing_and_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not found"):
        load_trace_file(tmp_path / "nope.csv")
    (tmp_path / "dir.jsonl").mkdir()
    with pytest.raises(InputError, match="not a regular file"):
        load_trace_file(tmp_path / "dir.jsonl")
    bad = tmp_path / "latin1.csv"
    bad.write_bytes(HEADER.encode() + b"1,2\xff\n")
    with pytest.raises(InputError):
        load_trace_file(bad)


# ---------------------------------------------------------------- build_trace


def test_build_trace_from_profile_is_deterministic() -> None:
    a = build_trace("sharegpt", 500, qps=2.0, seed=11)
    b = build_trace("sharegpt", 500, qps=2.0, seed=11)
    c = build_trace("sharegpt", 500, qps=2.0, seed=12)
    assert a == b and a != c
    assert [r.id for r in a] == list(range(500))
    assert all(isinstance(r, Request) and type(r.prompt_tokens) is int for r in a)
    arr = [r.arrival_s for r in a]
    assert arr == sorted(arr) and arr[0] > 0
    assert all(r.prompt_tokens + r.output_tokens <= 8192 for r in a)
    # Lengths come first from the shared rng, so the arrival process changes arrivals only.
    g = build_trace("sharegpt", 500, qps=2.0, seed=11, arrival="gamma", cv=3.0)
    assert [(r.prompt_tokens, r.output_tokens) for r in g] == [(r.prompt_tokens, r.output_tokens) for r in a]
    assert [r.arrival_s for r in g] != arr


def test_build_trace_replays_file_arrivals(tmp_path: Path) -> None:
    path = _write(tmp_path, "t.csv", HEADER_ARR + "0.0,10,5\n0.5,7,3\n1.25,1,1\n")
    reqs = build_trace(str(path), 2, qps=None, seed=0)
    assert reqs == [Request(0, 0.0, 10, 5), Request(1, 0.5, 7, 3)]
    assert build_trace(path, None, qps=None, seed=5)[2] == Request(2, 1.25, 1, 1)
    # a rate time-scales them: 2 gaps over 1.25 s is 1.6 requests per second
    assert [r.arrival_s for r in build_trace(path, None, qps=3.2, seed=0)] == [0.0, 0.25, 0.625]
    with pytest.raises(InputError, match="--arrival and --cv describe generated ones"):
        build_trace(path, None, qps=None, seed=5, arrival="gamma", cv=2.0)
    with pytest.raises(InputError, match="only 3"):
        build_trace(path, 4, qps=1.0, seed=0)


def test_build_trace_file_without_arrivals_generates_them(tmp_path: Path) -> None:
    path = _write(
        tmp_path, "t.jsonl", "".join(f'{{"prompt_tokens": {i + 1}, "output_tokens": 2}}\n' for i in range(10))
    )
    reqs = build_trace(path, None, qps=5.0, seed=3)
    assert [r.prompt_tokens for r in reqs] == list(range(1, 11))
    expected = poisson_arrivals(10, 5.0, np.random.default_rng(3))
    np.testing.assert_allclose([r.arrival_s for r in reqs], expected)
    assert build_trace(path, 4, qps=5.0, seed=3) == build_trace(path, 4, qps=5.0, seed=3)
    assert len(build_trace(path, 4, qps=5.0, seed=3)) == 4
    with pytest.raises(InputError, match="qps"):
        build_trace(path, 4, qps=0.0, seed=3)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"trace": "lmsys"}, "known: arxiv, sharegpt"),
        ({"num_requests": 0}, "num_requests"),
        ({"num_requests": None}, "number of requests is required"),
        ({"qps": -1.0}, "qps"),
        ({"qps": math.nan}, "qps"),
        ({"arrival": "uniform"}, "known: poisson, gamma"),
        ({"cv": 2.0}, "use arrival='gamma'"),
        ({"arrival": "gamma", "cv": 0.0}, "cv"),
        ({"seed": -1}, "seed"),
        ({"trace": "missing/file.csv"}, "not found"),
        ({"scale": 0.0}, "--scale"),
        ({"scale": -0.5}, "--scale"),
        ({"scale": math.nan}, "--scale"),
        ({"scale": math.inf}, "--scale"),
        ({"scale": True}, "--scale"),
    ],
)
def test_build_trace_rejects_bad_input(kwargs: dict, match: str) -> None:
    args = {"trace": "sharegpt", "num_requests": 10, "qps": 1.0, "seed": 0} | kwargs
    with pytest.raises(InputError, match=match):
        build_trace(**args)


def test_trace_max_total_tokens(tmp_path: Path) -> None:
    assert trace_max_total_tokens("sharegpt", []) == 8192
    assert trace_max_total_tokens("arxiv", build_trace("arxiv", 3, 1.0, 0)) == 16384
    path = _write(tmp_path, "t.csv", HEADER + "100,21\n60,4\n")
    assert trace_max_total_tokens(path, build_trace(path, None, 1.0, 0)) == 128
    path = _write(tmp_path, "u.csv", HEADER + "100,28\n")
    assert trace_max_total_tokens(path, build_trace(path, None, 1.0, 0)) == 128
    # scaled: a profile's cap scales (rounded up to 16); a file's is its longest scaled request, rounded up
    assert trace_max_total_tokens("sharegpt", build_trace("sharegpt", 50, 1.0, 0, scale=0.05), 0.05) == 416
    assert trace_max_total_tokens(path, build_trace(path, None, 1.0, 0, scale=0.5), 0.5) == 64


def test_scale_multiplies_lengths_and_keeps_arrivals(tmp_path: Path) -> None:
    full, small = build_trace("sharegpt", 200, 2.0, 4), build_trace("sharegpt", 200, 2.0, 4, scale=0.05)
    assert [r.arrival_s for r in small] == [r.arrival_s for r in full]
    for a, b in zip(full, small):  # rounded half up, at least 1
        assert b.prompt_tokens == max(1, math.floor(a.prompt_tokens * 0.05 + 0.5))
        assert b.output_tokens == max(1, math.floor(a.output_tokens * 0.05 + 0.5))
    assert min(r.output_tokens for r in small) == 1 < max(r.output_tokens for r in small)
    path = _write(tmp_path, "s.csv", HEADER + "100,21\n3,1\n")
    assert [(r.prompt_tokens, r.output_tokens)
            for r in build_trace(path, None, 1.0, 0, scale=0.5)] == [(50, 11), (2, 1)]


# ---------------------------------------------------------------- against the real traces


def _need(path: Path) -> None:
    if not path.is_file():
        pytest.skip(f"reference trace {path.name} not available")


def test_sharegpt_profile_vs_real_trace(samples, record_property) -> None:
    """Quantiles P25..P90 within 10% of the real trace, and the KS distance under a regression bound.

    Measured (seed 123, 100k samples): KS 0.048 (prompt) and 0.061 (output). The two-sample KS critical value
    here is ~0.009, so a parametric fit is expected to be "distinguishable"; the bound of 0.08 instead guards
    the choice of family: a lognormal fitted to the same medians and P90s scores 0.096 / 0.139. P10 is only
    reported: the real trace has a spike of very short requests (P10 74 / 84 tokens) that a two-parameter
    fit to median and P90 cannot follow (ours ~160 / ~138).
    """
    _need(SHAREGPT_REAL)
    real = load_trace_file(SHAREGPT_REAL)
    prompts, outputs = samples["sharegpt"]
    qs = [0.1, 0.25, 0.5, 0.75, 0.9]
    for what, ours, theirs in (
        ("prompt", prompts, real.prompt_tokens),
        ("output", outputs, real.output_tokens),
    ):
        ks = stats.ks_2samp(ours, theirs).statistic
        q_ours, q_real = np.quantile(ours, qs), np.quantile(theirs, qs)
        err = q_ours / q_real - 1
        print(
            f"sharegpt {what}: KS {ks:.4f}; quantiles P10..P90 ours {q_ours.round()} real {q_real} "
            f"rel. err {np.round(err * 100, 1)} %"
        )
        record_property(f"ks_{what}", round(float(ks), 4))
        assert ks < 0.08, f"{what} KS {ks:.4f}"
        assert np.all(np.abs(err[1:]) < 0.10), f"{what} P25..P90 errors {err[1:]}"
    real_rho = stats.spearmanr(real.prompt_tokens, real.output_tokens).statistic
    assert abs(real_rho - SHAREGPT_SPEARMAN) < 1e-3  # the constant in lengths.py is what the trace says


def test_splitwise_conv_loads_with_its_arrivals() -> None:
    _need(SPLITWISE_CONV)
    trace = load_trace_file(SPLITWISE_CONV)
    assert len(trace) == 19_366 and trace.arrival_s is not None
    assert trace.arrival_s[0] == 0.0 and trace.arrival_s[1] == pytest.approx(4.314579)
    assert np.all(np.diff(trace.arrival_s) >= 0)
    reqs = build_trace(SPLITWISE_CONV, 100, qps=None, seed=0)
    np.testing.assert_array_equal([r.arrival_s for r in reqs], trace.arrival_s[:100])
    assert [r.prompt_tokens for r in reqs[:2]] == [374, 396]


def test_priority_is_read_from_both_formats_and_defaults_to_zero(tmp_path: Path) -> None:
    from simctl.traces.build import build_trace

    csv = tmp_path / "t.csv"
    csv.write_text("num_prefill_tokens,num_decode_tokens,priority\n10,2,3\n20,4,-1\n", encoding="utf-8")
    assert [r.priority for r in build_trace(str(csv), None, 1.0, 0)] == [3, -1]
    jsonl = tmp_path / "t.jsonl"
    jsonl.write_text('{"prompt_tokens": 5, "output_tokens": 2, "priority": 2}\n'
                     '{"prompt_tokens": 6, "output_tokens": 2}\n', encoding="utf-8")
    assert [r.priority for r in build_trace(str(jsonl), None, 1.0, 0)] == [2, 0]
    assert {r.priority for r in build_trace("sharegpt", 5, 1.0, 0)} == {0}
    jsonl.write_text('{"prompt_tokens": 5, "output_tokens": 2, "priority": 1.5}\n', encoding="utf-8")
    with pytest.raises(InputError, match="line 1: priority is 1.5, expected an integer"):
        build_trace(str(jsonl), None, 1.0, 0)
