"""Fitting a cost model to a profile, and the `Fitted` cost model it produces.

Synthetic profiles are generated from known coefficients (with a tile step at 64) in the profiler's CSV
format; the fit must recover them (2%) and the tile exactly, and report a tiny held-out error on noise-free
data. `Fitted` is checked against a hand calculation of its formula, and its closed-form decode stretch
against repeated `iteration_time`. The roofline calibration must recover the efficiencies a `Roofline`
generated the data with.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from policies.plan import BatchPlan, Layout, packed, padded_decode, padded_prefill
from policies.seq import Seq
from profiler.fit import (
    COST_MODEL_FILE,
    PROFILE_COLUMNS,
    fit_profile,
    format_report,
    load_roofline_calibration,
    plans_from_rows,
)
from sim.cost import Fitted, Roofline
from sim.cost.fitted import COEFFICIENTS
from sim.models import get_model
from simctl.errors import InputError

TINY = get_model("tiny")
TINY_SHAPE = {f.name: getattr(TINY, f.name) for f in dataclasses.fields(TINY) if f.name != "description"}
META = {"model": "tiny", "model_shape": TINY_SHAPE, "device": "cpu", "device_name": "synthetic",
        "dtype": "float32", "threads": 2, "torch": "2.13.0", "transformers": "5.0", "date": "2025-01-01"}

# A GPU-like truth: a weight-streaming floor with a soft knee near T = 140, tile 64, every term visible.
TRUTH = {
    "overhead_s": 2.0e-3,
    "linear_mem_s": 8.0e-3,
    "linear_token_s": 6.0e-5,
    "lm_head_mem_s": 1.0e-3,
    "lm_head_row_s": 2.0e-5,
    "attn_unit_s": 2.0e-9,
    "attn_kv_token_s": 1.0e-6,
    "attn_segment_s": 5.0e-5,
    "decode_kv_token_s": 5.0e-8,
    "decode_row_s": 2.0e-5,
}
TILE = 64


def row(kind: str, B: int, T: int, sampled: int, segs: list[tuple[int, int]], rows: int, dkv: int,
        q: int = 0, c: int = 0) -> dict:
    return {"kind": kind, "batch_size": B, "linear_tokens": T, "sampled_tokens": sampled,
            "num_segments": len(segs), "attn_units": sum(qq * (cc + qq / 2) for qq, cc in segs),
            "attn_kv_tokens": sum(cc + qq for qq, cc in segs), "decode_rows": rows, "decode_kv": dkv,
            "q": q, "c": c, "reps": 5}


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
    return pd.DataFrame(rows)


def synth_times(df: pd.DataFrame, coef: dict[str, float], tile: int) -> np.ndarray:
    """The formula written out independently of sim/cost/fitted.py."""
    def tiled(n):
        return np.where(n <= tile, n, np.ceil(n / tile) * tile)
    T, r = df["linear_tokens"].to_numpy(float), df["sampled_tokens"].to_numpy(float)
    lin = np.where(T > 0, np.hypot(coef["linear_mem_s"], coef["linear_token_s"] * tiled(T)), 0)
    lm = np.where(r > 0, np.hypot(coef["lm_head_mem_s"], coef["lm_head_row_s"] * tiled(r)), 0)
    return (coef["overhead_s"] + lin + lm + coef["attn_unit_s"] * df["attn_units"]
            + coef["attn_kv_token_s"] * df["attn_kv_tokens"] + coef["attn_segment_s"] * df["num_segments"]
            + coef["decode_kv_token_s"] * df["decode_kv"]
            + coef["decode_row_s"] * df["decode_rows"]).to_numpy()


def write_profile(d: Path, df: pd.DataFrame, times: np.ndarray, meta: dict | None = None) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    df = df.copy()
    df["time_s"], df["time_p10_s"], df["time_p90_s"] = times, times * 0.98, times * 1.02
    df[list(PROFILE_COLUMNS)].to_csv(d / "profile.csv", index=False)
    (d / "meta.json").write_text(json.dumps(META if meta is None else meta))
    return d


def synthetic(d: Path, noise: float = 0.0, coef: dict[str, float] = TRUTH, tile: int = TILE,
              seed: int = 1) -> Path:
    df = design()
    t = synth_times(df, coef, tile)
    if noise:
        t = t * (1 + noise * np.random.default_rng(seed).standard_normal(len(t)))
    return write_profile(d, df, t)


# ---- the fit recovers what generated the data --------------------------------------------------------------
@pytest.fixture(scope="module")
def exact_fit(tmp_path_factory):
    d = synthetic(tmp_path_factory.mktemp("exact"))
    return fit_profile(d, plot=True)


def test_noise_free_recovers_coefficients_and_tile(exact_fit):
    r = exact_fit
    assert r.tile == TILE
    for k in COEFFICIENTS:
        assert r.coefficients[k] == pytest.approx(TRUTH[k], rel=0.02), k
    worst = max(abs(r.coefficients[k] / TRUTH[k] - 1) for k in COEFFICIENTS)
    assert worst < 1e-3
    assert r.not_covered == []
    # held out: 20% of each kind, tiny error on noise-free data
    assert set(r.holdout) == {"prefill", "decode", "hybrid", "padded_prefill", "padded_decode", "overall"}
    assert r.holdout_rows == sum(s.n for k, s in r.holdout.items() if k != "overall")
    assert r.holdout_rows == pytest.approx(0.2 * r.rows, abs=3)
    assert r.holdout["overall"].mape < 1e-4 and r.holdout["overall"].p95 < 1e-4
    # every other tile fits clearly worse
    assert all(e > 10 * r.tile_errors[TILE] for t, e in r.tile_errors.items() if t != TILE)
    text = format_report(r)
    assert "overall" in text and "tile      64" in text and "linear_token_s" in text
    assert r.plot_path is not None and r.plot_path.stat().st_size > 10_000


def test_one_percent_noise(tmp_path):
    """With 1% multiplicative noise the tile is still exact and the fitted function is within 0.5% of the
    truth everywhere. Coefficients the design pins down (standard error < 0.7%) are within 2%; the others are
    nearly collinear by nature (overhead vs the linear layers' weight floor: told apart only by the knee's
    curvature; LM-head row vs decode row: every decode row samples) and are within 3 standard errors, while
    the sums that matter (batch-1 floor; cost per decode row) are within 2%."""
    d = synthetic(tmp_path, noise=0.01)
    r = fit_profile(d, plot=False)
    assert r.tile == TILE
    c, se = r.coefficients, r.stderr
    for k in COEFFICIENTS:
        err = abs(c[k] / TRUTH[k] - 1)
        assert err <= max(0.02, 3 * se[k] / TRUTH[k]), (k, err, se[k] / TRUTH[k])
        if se[k] / TRUTH[k] < 0.007:
            assert err < 0.02, k
    for combo in (("overhead_s", "linear_mem_s", "lm_head_mem_s"), ("lm_head_row_s", "decode_row_s")):
        assert sum(c[k] for k in combo) == pytest.approx(sum(TRUTH[k] for k in combo), rel=0.02), combo
    df = design()
    truth = synth_times(df, TRUTH, TILE)
    fitted = Fitted.load(r.cost_model_path)
    pred = [fitted.iteration_time(p) for p in plans_from_rows(df)]
    assert np.max(np.abs(np.array(pred) / truth - 1)) < 0.005
    assert r.holdout["overall"].mape < 0.012  # ~ the noise itself (mean |N(0, 1%)| = 0.8%)
    assert r.tile_errors[TILE] == pytest.approx(0.01, rel=0.15)  # training RMS ~ the noise


def test_cpu_like_linear_data_is_fitted_without_knee_or_tile(tmp_path):
    """Linear CPU-like timings (no weight-streaming floor, no tile): mem terms ~0, tile 1, exact fit."""
    cpu = dict(TRUTH, linear_mem_s=0.0, lm_head_mem_s=0.0, overhead_s=1.5e-3, linear_token_s=8e-5)
    r = fit_profile(synthetic(tmp_path, coef=cpu, tile=1), plot=False)
    assert r.tile == 1
    assert r.coefficients["linear_mem_s"] < 1e-5 and r.coefficients["lm_head_mem_s"] < 1e-5
    assert r.coefficients["linear_token_s"] == pytest.approx(8e-5, rel=1e-3)
    assert r.holdout["overall"].mape < 1e-4


def test_split_is_seeded_and_holdout_zero_allowed(tmp_path):
    d = synthetic(tmp_path / "p")
    a = fit_profile(d, out=tmp_path / "a", seed=3, plot=False)
    b = fit_profile(d, out=tmp_path / "b", seed=3, plot=False)
    assert (tmp_path / "a" / COST_MODEL_FILE).read_text() == (tmp_path / "b" / COST_MODEL_FILE).read_text()
    assert a.coefficients == b.coefficients
    z = fit_profile(d, out=tmp_path / "z", holdout=0.0, plot=False)
    assert z.holdout == {} and z.holdout_rows == 0 and "overall" in z.train
    assert "overall" in format_report(z)


def test_uncovered_terms_are_zero_and_listed(tmp_path):
    df = design()
    df = df[df["kind"] == "prefill"]
    r = fit_profile(write_profile(tmp_path, df, synth_times(df, TRUTH, TILE)), plot=False)
    assert set(r.not_covered) == {"decode_kv_token_s", "decode_row_s"}
    assert r.coefficients["decode_kv_token_s"] == 0.0 and r.coefficients["decode_row_s"] == 0.0
    assert r.coefficients["attn_unit_s"] == pytest.approx(TRUTH["attn_unit_s"], rel=0.02)


# ---- Fitted ------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def fitted() -> Fitted:
    return Fitted(TRUTH, TILE, model="tiny", model_shape=TINY_SHAPE, dtype_bytes=4, memory_bytes=16 * 2**30)


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
    T_tiled, r = 320, 4  # 273 -> 5 tiles of 64; 4 rows <= one tile
    units = 200 * (1000 + 100) + 70 * 35
    kv = 1200 + 70
    c = TRUTH
    hand = (c["overhead_s"] + math.sqrt(c["linear_mem_s"] ** 2 + (c["linear_token_s"] * T_tiled) ** 2)
            + math.sqrt(c["lm_head_mem_s"] ** 2 + (c["lm_head_row_s"] * r) ** 2) + c["attn_unit_s"] * units
            + c["attn_kv_token_s"] * kv + c["attn_segment_s"] * 2 + c["decode_kv_token_s"] * 603
            + c["decode_row_s"] * 3)
    assert fitted.iteration_time(plan) == pytest.approx(hand, rel=1e-12)
    assert sum(fitted.breakdown(plan).values()) == pytest.approx(hand, rel=1e-12)


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
    fast = fitted.decode_stretch_times(plan, k)
    slow = [fitted.iteration_time(dataclasses.replace(plan, decode_kv=plan.decode_kv + j * 37))
            for j in range(k)]
    np.testing.assert_allclose(fast, slow, rtol=1e-12, atol=0)
    assert len(fitted.decode_stretch_times(plan, 0)) == 0


def test_cost_model_json_round_trips(exact_fit, tmp_path):
    loaded = Fitted.load(exact_fit.cost_model_path)
    assert loaded.tile == exact_fit.tile and loaded.coefficients == exact_fit.coefficients
    assert loaded.model == "tiny" and loaded.dtype_bytes == 4
    assert loaded.kv_bytes_per_token == TINY.kv_bytes_per_token(4)
    p = tmp_path / "again.json"
    p.write_text(json.dumps(loaded.to_json()))
    again = Fitted.load(p)
    assert again.to_json() == loaded.to_json()
    plan = BatchPlan([], [1] * 8, Layout.PACKED, 8, 8, decode_rows=8, decode_kv=8000)
    assert again.iteration_time(plan) == loaded.iteration_time(plan)
    # capacity: no memory recorded in the synthetic meta -> must be given
    with pytest.raises(InputError, match="memory"):
        loaded.kv_capacity_tokens()
    cap = loaded.kv_capacity_tokens(memory_bytes=16 * 2**30)
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
    rf = Roofline(model, "a100-80gb", dtype_bytes=2, **truth)
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
    assert kwargs == pytest.approx(cal.params)
    again = Roofline(model, "a100-80gb", dtype_bytes=2, tile=cal.tile, **kwargs)
    plan = BatchPlan([], [1] * 16, Layout.PACKED, 16, 16, decode_rows=16, decode_kv=16 * 2000)
    assert again.iteration_time(plan) == pytest.approx(rf.iteration_time(plan), rel=1e-3)
    # the fitted form prices Roofline-made data well too (only per-segment attention blending differs)
    assert r.holdout["overall"].mape < 0.02
    # memory recorded in meta.json: capacity from the cost model file
    assert Fitted.load(r.cost_model_path).kv_capacity_tokens() == rf.kv_capacity_tokens()
    assert "roofline  a100-80gb" in format_report(r)
