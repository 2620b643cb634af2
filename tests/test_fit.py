"""Fitting a cost model to a profile, and the `Fitted` cost model it produces.

Synthetic profiles are generated in the profiler's CSV format from a known truth written in the fitted form
(scalar coefficients, knot tables of the linear-layer and LM-head curves, a tile of 64); the fit must recover
the coefficients, the curves at their knots (1e-3) and the tile exactly, and report a tiny held-out error on
noise-free data. Also: 1% noise, a smooth GPU-like truth that is not piecewise linear (the old
sqrt(floor^2 + (slope x T)^2) form with tile steps), CPU-like data with one-off jumps (GEMV -> GEMM at T = 2,
a partition change at 128 -> 129: knot pairs, not a tile) and a plain line. `Fitted` is checked against a
hand calculation of its formula, its bisect pricing against the vectorised curve, and its closed-form decode
stretch against repeated `iteration_time`. The roofline calibration must recover the efficiencies a
`Roofline` generated the data with.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.costs import Fitted, Roofline
from simctl.costs.calibration import load_roofline_calibration
from simctl.costs.curves import pwl_array
from simctl.costs.features import decode_pad_kv
from simctl.costs.fitted_form import COEFFICIENTS
from simctl.costs.kv_capacity import kv_capacity_tokens
from simctl.costs.loader import load_cost
from simctl.policies.plan import BatchPlan, Layout, packed, padded_decode, padded_prefill
from simctl.policies.seq import Seq
from simctl.profiler.fit import COST_MODEL_FILE, fit_profile
from simctl.profiler.fit_coefficients import choose_knots, fit_coefficients
from simctl.profiler.fit_report import format_report
from simctl.profiler.fit_roofline import plans_from_rows
from simctl.profiler.profile_data import PROFILE_COLUMNS

TINY = get_model("tiny")
TINY_SHAPE = {f.name: getattr(TINY, f.name) for f in dataclasses.fields(TINY) if f.name != "description"}
META = {"model": "tiny", "model_shape": TINY_SHAPE, "device": "cpu", "device_name": "synthetic",
        "dtype": "float32", "threads": 2, "torch": "2.13.0", "transformers": "5.0", "date": "2025-01-01"}

# A GPU-like truth: the linear layers' weight-streaming floor blends into a compute slope (soft knee near
# T = 140: sqrt(8 ms^2 + (60 us x T)^2) sampled at powers of two, less its value at T = 1, which belongs to
# the overhead), the LM head likewise (1 ms floor, 20 us per row), tile 64, every term visible.
POW2 = [2 ** k for k in range(14)]  # 1 .. 8192
TRUTH_LINEAR = [(x, math.hypot(8e-3, 6e-5 * x) - math.hypot(8e-3, 6e-5)) for x in POW2]
TRUTH_LM_HEAD = [(0, 0.0)] + [(x, math.hypot(1e-3, 2e-5 * x)) for x in POW2[:9]]  # 0, 1 .. 256
# a decode row's attention beyond the shortest KV length profiled (17: 16 cached + the new token; a row's
# cost there is decode_row_s): 40 ns per KV token up to 1025 tokens, 60 ns beyond
TRUTH_DECODE = [(17, 0.0), (1025, 1008 * 4e-8), (8193, 1008 * 4e-8 + 7168 * 6e-8)]
TRUTH_CURVES = {"linear": TRUTH_LINEAR, "lm_head": TRUTH_LM_HEAD, "decode_kv": TRUTH_DECODE}
TRUTH = {
    "overhead_s": 2.0e-3 + math.hypot(8e-3, 6e-5),
    "attn_unit_s": 2.0e-9,
    "attn_kv_token_s": 1.0e-6,
    "attn_segment_s": 5.0e-5,
    "decode_pad_token_s": 3.0e-8,
    "decode_row_s": 2.0e-5,
}
TILE = 64
# The same device as the previous (closed) form: its curves are not piecewise linear.
SMOOTH = {"overhead_s": 2.0e-3, "linear_mem_s": 8.0e-3, "linear_token_s": 6.0e-5, "lm_head_mem_s": 1.0e-3,
          "lm_head_row_s": 2.0e-5, "decode_kv_token_s": 5.0e-8,
          **{k: v for k, v in TRUTH.items() if k != "overhead_s"}}


def row(kind: str, B: int, T: int, sampled: int, segs: list[tuple[int, int]], rows: int, dkv: int,
        q: int = 0, c: int = 0, pad: int = 0) -> dict:
    return {"kind": kind, "batch_size": B, "linear_tokens": T, "sampled_tokens": sampled,
            "num_segments": len(segs), "attn_units": sum(qq * (cc + qq / 2) for qq, cc in segs),
            "attn_kv_tokens": sum(cc + qq for qq, cc in segs), "decode_rows": rows, "decode_kv": dkv,
            "decode_pad_kv": pad, "eager_step": 0, "q": q, "c": c, "reps": 5}


def design() -> pd.DataFrame:
    """The shapes a profiler times: prefills (batched, chunked, off-tile), decodes, hybrids, padded."""
    rows = []
    lengths = [1, 8, 16, 33, 50, 63, 64, 65, 100, 127, 128, 129, 190, 255, 256, 257, 300, 384, 450, 511, 512,
               513, 700, 1000, 1023, 1024, 1025, 1500, 2047, 2048, 2049, 3000, 4096]
    for q in lengths:
        for B in (1, 2, 4):
            if B * q <= 8192:
                rows.append(row("prefill", B, B * q, B, [(q, 0)] * B, 0, 0, q, 0))
    for B in (8, 16, 32, 64, 128, 200):  # many short prompts: many LM-head rows without decode rows
        for q in (2, 8, 16, 40):
            rows.append(row("prefill", B, B * q, B, [(q, 0)] * B, 0, 0, q, 0))
    for q in (16, 64, 100, 200, 256, 257, 512, 1000, 2048):  # chunks on cached context; mid-prompt chunks
        for c in (256, 1024, 4096, 8192, 16384):  # sample nothing
            for sampled in (0, 1):
                rows.append(row("prefill", 1, q, sampled, [(q, c)], 0, 0, q, c))
    for B in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 40, 48, 64, 65, 80, 96, 128, 129, 160, 192, 256):
        for ctx in (16, 64, 128, 256, 512, 1024, 2048, 4096, 8192):
            rows.append(row("decode", B, B, B, [], B, B * (ctx + 1), 1, ctx))
    for B in (4, 16, 64, 128):  # batched mid-prompt chunks: segments without LM-head rows
        for q, c in ((8, 256), (16, 2048), (64, 1024)):
            rows.append(row("prefill", B, B * q, 0, [(q, c)] * B, 0, 0, q, c))
    for B in (1, 8, 32, 100):
        for q, c in ((64, 0), (129, 512), (256, 0), (500, 2048), (1024, 1024)):
            rows.append(row("hybrid", B + 1, B + q, B + 1, [(q, c)], B, B * 513, q, c))
    for B in (2, 4, 8):
        for L in (32, 100, 200, 512):
            rows.append(row("padded_prefill", B, B * L, B, [(L, 0)] * B, 0, 0, L, 0))
    for B in (4, 16, 64):
        for kv in (100, 1000, 4000):
            rows.append(row("padded_decode", B, B, B, [], B, B * kv, 1, kv))
    for B in (4, 8, 16, 32, 64, 128):  # ragged decode steps of mixed contexts: padding to the longest row
        for kv in (256, 1024, 4096):
            for low in (kv // 8, kv // 2):
                ctx = np.linspace(low, kv - 1, B).astype(int)
                dkv = int((ctx + 1).sum())
                rows.append(row("decode", B, B, B, [], B, dkv, 1, kv - 1, pad=B * kv - dkv))
    return pd.DataFrame(rows)


def curve(x: np.ndarray, knots: list[tuple[float, float]]) -> np.ndarray:
    """A knot table as a function (written out independently of costs/fitted.py): linear interpolation,
    the last slope beyond the last knot, 0 at 0."""
    xs, ys = (np.array(v, dtype=float) for v in zip(*knots))
    out = np.interp(x, xs, ys) + np.maximum(x - xs[-1], 0) * (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])
    return np.where(x > 0, out, 0.0)


def tiled(n: np.ndarray, tile: int) -> np.ndarray:
    return np.where(n <= tile, n, np.ceil(n / tile) * tile)


def scalar_terms(df: pd.DataFrame, coef: dict[str, float]) -> np.ndarray:
    return (coef["overhead_s"] + coef["attn_unit_s"] * df["attn_units"]
            + coef["attn_kv_token_s"] * df["attn_kv_tokens"] + coef["attn_segment_s"] * df["num_segments"]
            + coef["decode_pad_token_s"] * df["decode_pad_kv"]
            + coef["decode_row_s"] * df["decode_rows"]
            + coef.get("eager_step_s", 0.0) * df["eager_step"]).to_numpy()


def synth_times(df: pd.DataFrame, coef: dict[str, float] = TRUTH, tile: int = TILE,
                linear: list = TRUTH_LINEAR, lm_head: list = TRUTH_LM_HEAD,
                decode: list = TRUTH_DECODE) -> np.ndarray:
    T, r = df["linear_tokens"].to_numpy(float), df["sampled_tokens"].to_numpy(float)
    rows, kv = df["decode_rows"].to_numpy(float), df["decode_kv"].to_numpy(float)
    return (scalar_terms(df, coef) + curve(tiled(T, tile), linear) + curve(tiled(r, tile), lm_head)
            + rows * curve(kv / np.maximum(rows, 1), decode))


def smooth_times(df: pd.DataFrame, coef: dict[str, float] = SMOOTH, tile: int = TILE) -> np.ndarray:
    """The previous closed form: sqrt(floor^2 + (slope x tiled count)^2) for the linear layers and LM head,
    and one cost per decode KV token."""
    T, r = df["linear_tokens"].to_numpy(float), df["sampled_tokens"].to_numpy(float)
    lin = np.where(T > 0, np.hypot(coef["linear_mem_s"], coef["linear_token_s"] * tiled(T, tile)), 0)
    lm = np.where(r > 0, np.hypot(coef["lm_head_mem_s"], coef["lm_head_row_s"] * tiled(r, tile)), 0)
    return scalar_terms(df, coef) + lin + lm + coef["decode_kv_token_s"] * df["decode_kv"].to_numpy(float)


def write_profile(d: Path, df: pd.DataFrame, times: np.ndarray, meta: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    df = df.copy()
    df["time_s"], df["time_p10_s"], df["time_p90_s"] = times, times * 0.98, times * 1.02
    df[list(PROFILE_COLUMNS)].to_csv(d / "profile.csv", index=False)
    (d / "meta.json").write_text(json.dumps(META if meta is None else meta))
    return d


def synthetic(d: Path, noise: float = 0.0, seed: int = 1, times=synth_times, **kw) -> Path:
    df = design()
    t = times(df, **kw)
    if noise:
        t = t * (1 + noise * np.random.default_rng(seed).standard_normal(len(t)))
    return write_profile(d, df, t)


def curve_error(fitted: list[tuple[int, float]], truth: list[tuple[float, float]], upto: float,
                floor: float = TRUTH["overhead_s"]) -> float:
    """Largest difference of two curves at the truth's knots up to `upto`, relative to the time of an
    iteration of that many tokens (the curve plus a `floor`, by default the overhead)."""
    xs = np.array([x for x, _ in truth if 0 < x <= upto], dtype=float)
    return float(np.max(np.abs(curve(xs, fitted) - curve(xs, truth)) / (floor + curve(xs, truth))))


# ---- the fit recovers what generated the data --------------------------------------------------------------
@pytest.fixture(scope="module")
def exact_fit(tmp_path_factory):
    d = synthetic(tmp_path_factory.mktemp("exact"))
    return fit_profile(d, plot=True)


def test_noise_free_recovers_coefficients_curves_and_tile(exact_fit):
    r = exact_fit
    assert r.tile == TILE
    for k in COEFFICIENTS:
        assert r.coefficients[k] == pytest.approx(TRUTH.get(k, 0.0), rel=1e-3), k
    assert curve_error(r.linear, TRUTH_LINEAR, 8192) < 1e-3
    assert curve_error(r.lm_head, TRUTH_LM_HEAD, 256) < 1e-3
    assert curve_error(r.curves["decode_kv"], TRUTH_DECODE, 8193, floor=TRUTH["decode_row_s"]) < 1e-3
    # the knots sit where the profile measured (tiled counts), and include the truth's kinks
    assert {x for x, _ in TRUTH_LINEAR} <= {x for x, _ in r.linear}
    assert all(x <= 64 or x % 64 == 0 for x, _ in r.linear)
    assert r.linear[0] == (1, 0.0) and r.lm_head[0] == (0, 0.0)
    assert r.not_covered == []
    # held out: 20% of each kind, tiny error on noise-free data
    assert set(r.holdout) == {"prefill", "decode", "hybrid", "padded_prefill", "padded_decode", "overall"}
    assert r.holdout_rows == sum(s.n for k, s in r.holdout.items() if k != "overall")
    assert r.holdout_rows == pytest.approx(0.2 * r.rows, abs=3)
    assert r.holdout["overall"].mape < 1e-4 and r.holdout["overall"].p95 < 1e-4
    # every other tile fits clearly worse
    assert all(e > 10 * r.tile_errors[TILE] for t, e in r.tile_errors.items() if t != TILE)
    text = format_report(r)
    assert "overall" in text and "tile      64" in text and "linear curve" in text and "lm_head curve" in text
    assert r.plot_path is not None and r.plot_path.stat().st_size > 10_000


def test_one_percent_noise(tmp_path):
    """With 1% multiplicative noise the tile is still exact, the held-out error is the noise's, and the
    fitted function is within 0.3% of the truth on the median profiled shape and within 2.5% on every one
    (the worst sit at the sparsest knots, e.g. T = 4160 just past 4096, where a couple of noisy rows set a
    knot: the price of knots that can follow a real step there). Coefficients the design pins down
    (standard error < 0.7%) are within 2%, the others within 3 standard errors; the linear-layer curve is
    within 2% (of an iteration's time) at every knot of the truth."""
    d = synthetic(tmp_path, noise=0.01)
    r = fit_profile(d, plot=False)
    assert r.tile == TILE
    c, se = r.coefficients, r.stderr
    assert c["eager_step_s"] == 0  # an eager profile: no step runs eager beside decode graphs
    for k, truth in TRUTH.items():
        err = abs(c[k] / truth - 1)
        assert err <= max(0.02, 3 * se[k] / truth), (k, err, se[k] / truth)
        if se[k] / truth < 0.007:
            assert err < 0.02, k
    assert curve_error(r.linear, TRUTH_LINEAR, 8192) < 0.02
    assert curve_error(r.curves["decode_kv"], TRUTH_DECODE, 8193, floor=TRUTH["decode_row_s"]) < 0.02
    df = design()
    truth = synth_times(df)
    fitted = Fitted.load(r.cost_model_path)
    pred = np.array([fitted.iteration_time(p) for p in plans_from_rows(df)])
    dev = np.abs(pred / truth - 1)
    assert dev.max() < 0.025 and np.median(dev) < 0.003
    # decode rows: the per-row cost (decode row + LM head + linear layers) at each batch size, and padding
    dec = (df["kind"] == "decode").to_numpy()
    assert np.abs(pred[dec] / truth[dec] - 1).max() < 0.015
    assert r.holdout["overall"].mape < 0.012  # ~ the noise itself (mean |N(0, 1%)| = 0.8%)
    assert r.tile_errors[TILE] == pytest.approx(0.01, rel=0.15)  # training RMS ~ the noise


def test_smooth_gpu_curves_and_tile_steps_are_followed(tmp_path):
    """Data from a closed form the curves can only approximate (a soft knee, not piecewise linear), with
    tile steps: the tile is found exactly and every shape is priced within 0.5% (the knots sit at the
    profiled counts, so the only error is the chord between knots)."""
    r = fit_profile(synthetic(tmp_path, times=smooth_times), plot=False)
    assert r.tile == TILE
    assert all(e > 3 * r.tile_errors[TILE] for t, e in r.tile_errors.items() if t != TILE)
    df = design()
    pred = np.array([Fitted.load(r.cost_model_path).iteration_time(p) for p in plans_from_rows(df)])
    assert np.abs(pred / smooth_times(df) - 1).max() < 0.005
    assert r.holdout["overall"].mape < 0.002
    assert r.coefficients["attn_unit_s"] == pytest.approx(TRUTH["attn_unit_s"], rel=0.03)
    # one cost per KV token: a straight decode curve from the shortest KV length profiled (17), whose
    # tokens are in decode_row_s
    xs = np.array([x for x, _ in r.curves["decode_kv"]], dtype=float)
    assert xs[0] == 17
    np.testing.assert_allclose(curve(xs, r.curves["decode_kv"]), 5e-8 * (xs - 17), rtol=0.03, atol=2e-7)


def test_cpu_like_jumps_are_knot_pairs_not_a_tile(tmp_path):
    """A CPU's linear layers: GEMV at one token, a step to GEMM at two (the second thread woken for every
    operator), flat to 16, a step between 128 and 129 (another partitioning), then linear; no tile. The fit
    keeps tile 1 and puts the steps between the knots 1-2 and 128-129 (the grid times both sides)."""
    lin = [(1, 0.0), (2, 2.5e-3), (16, 3.0e-3), (128, 8.0e-3), (129, 10.0e-3), (8192, 10e-3 + 8063 * 6e-5)]
    coef = dict(TRUTH, overhead_s=2.5e-3)
    lm = [(0, 0.0), (1, 1e-4), (256, 1e-4 + 255 * 5e-6)]
    r = fit_profile(synthetic(tmp_path, coef=coef, tile=1, linear=lin, lm_head=lm), plot=False)
    assert r.tile == 1
    assert r.holdout["overall"].mape < 1e-4
    f = dict(r.linear)
    assert f[2] - f[1] == pytest.approx(2.5e-3, rel=1e-3)
    assert f[129] - f[128] == pytest.approx(2.0e-3, rel=1e-3)
    assert curve_error(r.linear, lin, 8192) < 1e-3


def test_cpu_like_linear_data_is_fitted_without_knee_or_tile(tmp_path):
    """Linear CPU-like timings (no weight-streaming floor, no tile): tile 1, straight curves, exact fit."""
    lin = [(1, 0.0), (2, 8e-5)]  # 80 us per token beyond the first (which is in the overhead)
    lm = [(0, 0.0), (1, 2e-5), (2, 4e-5)]
    r = fit_profile(synthetic(tmp_path, tile=1, linear=lin, lm_head=lm,
                              coef=dict(TRUTH, overhead_s=1.5e-3)), plot=False)
    assert r.tile == 1
    # the linear curve where single prompts pin it (one LM-head row at most); at counts only decode rows
    # have (T = r), only the sum of the two curves is determined
    df = design()
    single = set(df.loc[df["sampled_tokens"] <= 1, "linear_tokens"])
    xs = np.array([x for x, _ in r.linear if x in single], dtype=float)
    np.testing.assert_allclose(curve(xs, r.linear), 8e-5 * (xs - 1), rtol=1e-3, atol=1e-9)
    b = df.loc[df["kind"] == "decode", "batch_size"].unique().astype(float)
    np.testing.assert_allclose(curve(b, r.linear) + curve(b, r.lm_head), 8e-5 * (b - 1) + 2e-5 * b, rtol=1e-3)
    assert r.coefficients["overhead_s"] == pytest.approx(1.5e-3, rel=1e-3)
    assert r.holdout["overall"].mape < 1e-4


def test_knots_are_where_the_profile_measured():
    counts = np.array([1, 2, 3, 4, 5, 7, 8, 9, 12, 15, 16, 17, 20, 31, 32, 33, 48, 50, 64, 100, 129, 130, 200,
                       4096])
    assert choose_knots(counts, 1) == [1, 2, 3, 4, 5, 8, 9, 12, 16, 17, 32, 33, 48, 64, 129, 4096]
    # 250: no knot (the last slope continues)
    assert choose_knots(np.array([0, 0, 1, 8, 250]), 0) == [0, 1, 8]
    assert choose_knots(np.array([0.0]), 0) == [0]


def test_split_is_seeded_and_holdout_zero_allowed(tmp_path):
    d = synthetic(tmp_path / "p")
    a = fit_profile(d, out=tmp_path / "a", seed=3, plot=False)
    b = fit_profile(d, out=tmp_path / "b", seed=3, plot=False)
    assert (tmp_path / "a" / COST_MODEL_FILE).read_text() == (tmp_path / "b" / COST_MODEL_FILE).read_text()
    assert a.coefficients == b.coefficients and a.linear == b.linear
    z = fit_profile(d, out=tmp_path / "z", holdout=0.0, plot=False)
    assert z.holdout == {} and z.holdout_rows == 0 and "overall" in z.train
    assert "overall" in format_report(z)


def test_uncovered_terms_are_zero_and_listed(tmp_path):
    df = design()
    df = df[df["kind"] == "prefill"]
    r = fit_coefficients(df.assign(time_s=synth_times(df)))
    assert set(r.not_covered) == {"decode_pad_token_s", "decode_row_s"}
    assert r.coefficients["decode_row_s"] == 0.0 and r.curves["decode_kv"] == [(1, 0.0)]
    assert r.coefficients["attn_unit_s"] == pytest.approx(TRUTH["attn_unit_s"], rel=0.02)


@pytest.mark.parametrize("kind", ["prefill", "decode"])
def test_a_profile_without_decode_or_prefill_rows_is_refused(tmp_path, kind):
    """Its cost model would price the missing kind at nothing (a fit without decodes predicted TBT 0 s)."""
    df = design()
    df = df[df["decode_rows"] == 0] if kind == "decode" else df[df["num_segments"] == 0]
    with pytest.raises(InputError, match=f"no iteration has {kind} rows"):
        fit_profile(write_profile(tmp_path, df, synth_times(df)), plot=False)
    assert not (tmp_path / "cost_model.json").exists()


# ---- Fitted ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted() -> Fitted:
    return Fitted(TRUTH, TILE, TRUTH_CURVES, model="tiny", model_shape=TINY_SHAPE, dtype_bytes=4,
                  memory_bytes=16 * 2**30)


def seq(prompt: int, computed: int = 0, generated: int = 0, pid: int = 0) -> Seq:
    s = Seq(pid, 0.0, prompt, 100)
    s.computed, s.generated = computed, generated
    return s


def test_fitted_prices_a_hybrid_plan_by_hand(fitted):
    # 3 decodes (contexts 100, 200, 300), a chunk of 200 on 1000 cached tokens (mid-prompt: not sampled) and
    # a whole prompt of 70 (sampled)
    decodes = [seq(50, 100, 1, 0), seq(50, 200, 1, 1), seq(50, 300, 1, 2)]
    for s in decodes:
        s.prefill_end = s.computed
    plan = packed([*decodes, seq(2000, 1000, 0, 3), seq(70, 0, 0, 4)], [1, 1, 1, 200, 70])
    assert (plan.linear_tokens, plan.sampled_tokens, plan.decode_rows, plan.decode_kv) == (273, 4, 3, 603)
    # 273 -> 5 tiles of 64 = 320 tokens: a quarter of the way from the knot at 256 to the one at 512
    lin = dict(TRUTH_LINEAR)
    linear = lin[256] + (320 - 256) / (512 - 256) * (lin[512] - lin[256])
    lm_head = dict(TRUTH_LM_HEAD)[4]  # 4 rows <= one tile: a knot
    units = 200 * (1000 + 100) + 70 * 35
    kv = 1200 + 70
    c = TRUTH
    pad = 3 * (300 + 1) - 603  # padding the decode rows to the longest (context 300)
    assert decode_pad_kv(plan) == pad == 300
    hand = (c["overhead_s"] + linear + lm_head + c["attn_unit_s"] * units + c["attn_kv_token_s"] * kv
            + c["attn_segment_s"] * 2 + 3 * (201 - 17) * 4e-8 + c["decode_pad_token_s"] * pad
            + c["decode_row_s"] * 3)
    assert fitted.iteration_time(plan) == pytest.approx(hand, rel=1e-12)
    assert sum(fitted.breakdown(plan).values()) == pytest.approx(hand, rel=1e-12)
    assert fitted.breakdown(plan)["linear"] == pytest.approx(linear, rel=1e-12)


def test_fitted_curves_bisect_as_the_vectorised_form(fitted):
    """`iteration_time` prices one count at a time (bisect into the knots): it agrees with `pwl_array` at
    every count, on and between knots, below the first and beyond the last (the last slope continues)."""
    counts = np.unique(np.concatenate([np.arange(0, 300), np.geomspace(1, 40000, 300).round()])).astype(int)
    for curve_at, knots in ((fitted._lin, fitted.linear), (fitted._lm, fitted.lm_head),
                            (fitted._dec, fitted.curves["decode_kv"])):
        for x in (counts, counts + 0.37):  # the decode curve is read at mean KV lengths
            vec = pwl_array(x, knots)
            np.testing.assert_allclose([curve_at(v) for v in x], vec, rtol=1e-12, atol=1e-18)
            assert np.all(np.diff(vec) >= 0)  # monotone
    assert fitted._lm(0) == 0.0 and fitted._lin(1) == 0.0
    top = TRUTH_LINEAR[-1][0]
    slope = (TRUTH_LINEAR[-1][1] - TRUTH_LINEAR[-2][1]) / (top - TRUTH_LINEAR[-2][0])
    assert fitted._lin(3 * top) == pytest.approx(TRUTH_LINEAR[-1][1] + 2 * top * slope, rel=1e-12)


def test_fitted_sees_padding_and_tiles(fitted):
    seqs = [seq(100, pid=0), seq(30, pid=1)]
    padded = padded_prefill(seqs)  # 2 x 100, pads computed, segments of 100
    assert fitted.iteration_time(padded) > fitted.iteration_time(packed(seqs, [100, 30]))
    plan = padded_decode(seqs, 4, 500)  # 4 rows (2 finished still computed) x 500 KV columns
    assert plan.decode_kv == 2000 and plan.linear_tokens == 4
    plans = [BatchPlan([], [], Layout.PACKED, n, 1, [n], [0]) for n in (256, 257, 320)]
    t = [fitted.iteration_time(p) for p in plans]
    lin = [fitted.breakdown(p)["linear"] for p in plans]
    assert lin[1] == lin[2] > lin[0]  # 257 tokens pay the linear layers for 320 (5 tiles of 64)
    assert t[1] - t[0] > 0.5 * (lin[2] - lin[0])


def test_decode_stretch_equals_repeated_iteration_time(fitted):
    plan = BatchPlan([], [1] * 37, Layout.PACKED, 37, 37, decode_rows=37, decode_kv=37 * 900)
    k = 500
    fast = fitted.stretch_times(plan, k)
    slow = [fitted.iteration_time(dataclasses.replace(plan, decode_kv=plan.decode_kv + j * 37))
            for j in range(k)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=0)
    assert len(fitted.stretch_times(plan, 0)) == 0
    # decode rows of mixed contexts, advanced token by token: the padding to the longest row stays the same
    seqs = [seq(10, c, 1, i) for i, c in enumerate((50, 400, 1200, 90))]
    for s in seqs:
        s.prefill_end = s.computed
    first = packed(seqs, [1] * 4)
    fast = fitted.stretch_times(first, k)
    pads, slow = set(), []
    for _ in range(k):  # priced as the simulator would, one iteration at a time
        plan = packed(seqs, [1] * 4)
        pads.add(decode_pad_kv(plan))
        slow.append(fitted.iteration_time(plan))
        for s in seqs:
            s.computed += 1
            s.prefill_end += 1
    assert pads == {4 * 1201 - sum(c + 1 for c in (50, 400, 1200, 90))}
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=0)


def test_cost_model_json_round_trips(exact_fit, tmp_path):
    loaded = Fitted.load(exact_fit.cost_model_path)
    assert loaded.tile == exact_fit.tile and loaded.coefficients == exact_fit.coefficients
    assert loaded.linear == exact_fit.linear and loaded.lm_head == exact_fit.lm_head
    assert loaded.model == "tiny" and loaded.dtype_bytes == 4
    assert loaded.kv_bytes_per_token == TINY.kv_bytes_per_token(4)
    p = tmp_path / "again.json"
    p.write_text(json.dumps(loaded.to_json()))
    again = Fitted.load(p)
    assert again.to_json() == loaded.to_json()
    plan = BatchPlan([], [1] * 8, Layout.PACKED, 8, 8, decode_rows=8, decode_kv=8000)
    assert again.iteration_time(plan) == loaded.iteration_time(plan)
    # capacity: the deployment's, in the fit's dtype (no memory recorded in the synthetic meta: the GPU's)
    cap = kv_capacity_tokens(TINY, get_gpu("cpu"), 1, loaded.dtype_bytes, loaded.memory_bytes)
    assert cap == int((16 * 2**30 * 0.9 - TINY.weight_bytes(4) - 2 * 2**30) // TINY.kv_bytes_per_token(4))


def test_fitted_refuses_another_model(fitted):
    fitted.check_model("tiny")
    fitted.check_model(TINY)
    with pytest.raises(InputError, match="fitted for model 'tiny'"):
        fitted.check_model("mistral-7b")
    with pytest.raises(InputError, match="num_layers"):
        fitted.check_model(dataclasses.replace(TINY, num_layers=2))


@pytest.mark.parametrize("edit, match", [
    (lambda d: d["coefficients"].pop("decode_row_s"), "decode_row_s"),
    (lambda d: d.pop("tile"), "tile"),
    (lambda d: d["coefficients"].update(attn_unit_s=float("nan")), "attn_unit_s"),
    (lambda d: d["coefficients"].update(overhead_s=-1e-3), "overhead_s"),
    (lambda d: d.update(tile=0), "tile"),
    (lambda d: d.update(format="x"), "format"),
    (lambda d: d.update(version=1), "version"),
    (lambda d: d.pop("curves"), "curves"),
    (lambda d: d["curves"].pop("decode_kv"), "decode_kv"),
    (lambda d: d["curves"]["linear"].reverse(), "linear"),
    (lambda d: d["curves"]["linear"].pop(0), "linear: the first knot must be at n = 1"),
    (lambda d: d["curves"]["lm_head"][-1].__setitem__(1, 0.0), "lm_head: seconds must not decrease"),
    (lambda d: d["curves"]["lm_head"].append([5000, -1.0]), "lm_head"),
    (lambda d: d["curves"]["linear"].__setitem__(2, [3.5, 1e-3]), "linear"),
    (lambda d: d["curves"].update(decode_kv=[]), "decode_kv"),
])
def test_bad_cost_model_json(exact_fit, tmp_path, edit, match):
    data = json.loads(exact_fit.cost_model_path.read_text())
    edit(data)
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(data))
    with pytest.raises(InputError, match=match) as e:
        Fitted.load(p)
    assert str(p) in str(e.value) and "\n" not in str(e.value)


def test_unreadable_cost_model(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        Fitted.load(tmp_path / "nope.json")
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(InputError, match="not valid JSON"):
        Fitted.load(tmp_path / "x.json")


# ---- corrupt profiles --------------------------------------------------------------------------------------
def _corrupt(d: Path, how: str) -> None:
    csv = d / "profile.csv"
    df = pd.read_csv(csv)
    if how == "missing column":
        df.drop(columns=["attn_units"]).to_csv(csv, index=False)
    elif how == "nan":
        df.loc[3, "time_s"] = float("nan")
        df.to_csv(csv, index=False)
    elif how == "negative time":
        df.loc[5, "time_s"] = -0.01
        df.to_csv(csv, index=False)
    elif how == "zero time":
        df.loc[5, "time_s"] = 0.0
        df.to_csv(csv, index=False)
    elif how == "negative count":
        df.loc[2, "decode_kv"] = -4
        df.to_csv(csv, index=False)
    elif how == "text":
        df["linear_tokens"] = df["linear_tokens"].astype(object)
        df.loc[1, "linear_tokens"] = "many"
        df.to_csv(csv, index=False)
    elif how == "empty":
        df.iloc[:0].to_csv(csv, index=False)
    elif how == "empty file":
        csv.write_text("")
    elif how == "no csv":
        csv.unlink()
    elif how == "no meta":
        (d / "meta.json").unlink()
    elif how == "bad meta":
        (d / "meta.json").write_text(json.dumps({"model": "tiny"}))
    elif how == "bad shape":
        (d / "meta.json").write_text(json.dumps(dict(META, model_shape=dict(TINY_SHAPE, num_layers=0))))


@pytest.mark.parametrize("how, match", [
    ("missing column", "missing column.*attn_units"), ("nan", "time_s"), ("negative time", "time_s"),
    ("zero time", "time_s"), ("negative count", "decode_kv"), ("text", "linear_tokens"), ("empty", "no rows"),
    ("empty file", "empty"), ("no csv", "profile.csv is missing"), ("no meta", "meta.json is missing"),
    ("bad meta", "model_shape"), ("bad shape", "num_layers"),
])
def test_corrupt_profile(tmp_path, how, match):
    d = synthetic(tmp_path / "p")
    _corrupt(d, how)
    with pytest.raises(InputError, match=match) as e:
        fit_profile(d, plot=False)
    assert "\n" not in str(e.value)
    assert not (d / COST_MODEL_FILE).exists()


def test_bad_arguments(tmp_path):
    d = synthetic(tmp_path)
    with pytest.raises(InputError, match="holdout"):
        fit_profile(d, holdout=1.0)
    with pytest.raises(InputError, match="unknown GPU"):
        fit_profile(d, roofline_gpu="tpu-v9")
    with pytest.raises(InputError, match="no such directory"):
        fit_profile(tmp_path / "missing")


# ---- roofline calibration ----------------------------------------------------------------------------------
def test_roofline_calibration_recovers_efficiencies(tmp_path):
    model = get_model("mistral-7b")
    shape = {f.name: getattr(model, f.name) for f in dataclasses.fields(model) if f.name != "description"}
    truth = {"mfu": 0.55, "mbu": 0.62, "attn_mfu": 0.35, "overhead_s": 4e-3}
    rf = Roofline(model, "a100-80gb", dtype_bytes=2, request_s=0.0, **truth)  # the calibrated form's terms
    df = design()
    times = np.array([rf.iteration_time(p) for p in plans_from_rows(df)])
    meta = dict(META, model="mistral-7b", model_shape=shape, dtype="bfloat16", device="cuda",
                device_name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * 2**30)
    d = write_profile(tmp_path / "p", df, times, meta)
    r = fit_profile(d, roofline_gpu="a100-80gb", plot=False)
    assert r.tile == 128  # the A100's tile, found by the fitted form too
    cal = r.roofline
    assert cal is not None and cal.at_bound == []
    for k, v in truth.items():
        assert cal.params[k] == pytest.approx(v, rel=0.02), k
    assert cal.holdout["overall"].mape < 1e-4
    kwargs = load_roofline_calibration(cal.path)
    assert kwargs == pytest.approx({**cal.params, "request_s": 0.0})  # overhead_s holds all host time
    again = Roofline(model, "a100-80gb", dtype_bytes=2, tile=cal.tile, **kwargs)
    plan = BatchPlan([], [1] * 16, Layout.PACKED, 16, 16, decode_rows=16, decode_kv=16 * 2000)
    assert again.iteration_time(plan) == pytest.approx(rf.iteration_time(plan), rel=1e-3)
    # the fitted form prices Roofline-made data well too (only per-segment attention blending differs)
    assert r.holdout["overall"].mape < 0.02
    # memory recorded in meta.json: the deployment's capacity on the fit's recorded memory and dtype
    f = Fitted.load(r.cost_model_path)
    assert (kv_capacity_tokens(model, get_gpu("cpu"), 1, f.dtype_bytes, f.memory_bytes)
            == kv_capacity_tokens(model, get_gpu("a100-80gb")))
    assert "roofline  a100-80gb" in format_report(r)


# ---- where a cost model may be used (issue 13: a CPU's efficiencies priced an A100 at 77 s per token) ------
def test_a_cpu_profile_calibrates_only_the_cpu_roofline(tmp_path):
    d = synthetic(tmp_path / "p")
    with pytest.raises(InputError, match="--roofline-gpu a100-80gb: the profile was measured on synthetic"):
        fit_profile(d, roofline_gpu="a100-80gb", plot=False)
    assert not (d / COST_MODEL_FILE).exists()
    cal = fit_profile(d, roofline_gpu="cpu", plot=False).roofline
    assert cal is not None
    with pytest.raises(InputError, match="measured on a CPU, and cannot price a100-80gb"):
        load_cost(cal.path, get_model("tiny"), get_gpu("a100-80gb"))
    loaded = load_cost(cal.path, get_model("tiny"), get_gpu("cpu"))
    label, warnings = loaded.label, loaded.warnings
    assert label.startswith("roofline calibrated by") and warnings == []


def test_a_gpu_calibration_on_another_gpu_or_model_is_used_with_warnings(tmp_path):
    cal = tmp_path / "roofline_calibration.json"
    cal.write_text(json.dumps({"format": "simctl.roofline-calibration", "version": 2, "gpu": "a100-80gb",
                               "measured_on": "a100-80gb", "model": "mistral-7b",
                               "params": {"mfu": 0.5, "mbu": 0.6, "attn_mfu": 0.3, "overhead_s": 0.004}}))
    same = load_cost(cal, get_model("mistral-7b"), get_gpu("a100-80gb")).warnings
    assert same == []
    other = load_cost(cal, get_model("llama-2-7b"), get_gpu("h100")).warnings
    assert len(other) == 2
    assert "measured on a100-80gb and are applied to h100" in other[0] and "llama-2-7b" in other[1]
    older = json.loads(cal.read_text())
    del older["measured_on"]
    cal.write_text(json.dumps(older))
    with pytest.raises(InputError, match="does not record the device it was measured on"):
        load_cost(cal, get_model("mistral-7b"), get_gpu("a100-80gb"))


def test_a_fitted_model_prices_only_its_device(exact_fit):
    path = exact_fit.cost_model_path
    with pytest.raises(InputError,
                       match="fitted on synthetic, so its times are that device's, not a100-80gb's"):
        load_cost(path, get_model("tiny"), get_gpu("a100-80gb"))
    assert load_cost(path, get_model("tiny"), get_gpu("cpu")).warnings == []

