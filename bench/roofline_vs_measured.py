"""The roofline checked against real GPU operator times (Vidur's, ../shared/reference/gpu_profiles).

    python bench/roofline_vs_measured.py [--root ../shared/reference/gpu_profiles]

Per GPU (A100, H100, A40), per operator class (QKV, O, gate+up, down, the layer's linears as the roofline
prices them: one blend over their sum, norms, all-reduce, attention where measured), every model and TP degree
at 1..4096 tokens: the roofline's time against the measured median, as signed errors (roofline / measured -
1).

The efficiencies the catalogue now holds per GPU (`catalogue.gpus`: mfu, mbu, gemm_latency_s; not the H100's
mbu since issue 39: 0.994 here, 0.856 fitted to served decode) are fitted here on the TRAIN models only
(least squares of log(roofline / measured) of the layer's linears), and the errors are reported apart on the
models they were not fitted on. Writes bench/results/roofline_vs_measured.md and .png.
"""

from __future__ import annotations

import argparse
import dataclasses
import tempfile
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from fit_worst import worst_fits_section
from roofline_forms import FORMS, compare_forms, forms_section, gemm_points
from scipy.optimize import isotonic_regression, least_squares

from simctl.catalogue.gpus import catalogue_gpu_of, get_gpu
from simctl.catalogue.models import ModelSpec
from simctl.common.errors import InputError
from simctl.costs.gpu_share import GEMMS_PER_LAYER
from simctl.costs.roofline import Roofline
from simctl.profiler.fit_operators import fit_operator_profile
from simctl.profiler.operator_profiles import load_operator_profile

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference" / "gpu_profiles"
OUT = ROOT / "bench" / "results" / "roofline_vs_measured"
TRAIN = ("Llama-2-7b-hf", "Llama-2-70b-hf", "internlm-20b")  # fitted on; every other model is held out
LINEARS = {"qkv": "attn_pre_proj", "o": "attn_post_proj", "gate_up": "mlp_up_proj", "down": "mlp_down_proj"}
MAX_TOKENS = 4096


@dataclasses.dataclass
class Measured:
    gpu: str
    model: str
    spec: ModelSpec  # one layer of the profiled shape
    tp: int
    tokens: np.ndarray
    ops: dict[str, np.ndarray]  # seconds per call
    allreduce: tuple[np.ndarray, np.ndarray] | None


def layer_spec(csv: Path) -> ModelSpec:
    s = pd.read_csv(csv, nrows=1).iloc[0]
    h, heads = int(s["n_embd"]), int(s["n_head"])
    return ModelSpec(csv.parent.name, 1, h, heads, int(s["n_kv_head"]), h // heads, int(s["n_expanded_embd"]),
                     int(s["vocab_size"]), MAX_TOKENS, mlp="gated" if bool(s["use_gated_mlp"]) else "plain")


def measurements(root: Path) -> list[Measured]:
    out = []
    for csv in sorted((root / "compute").glob("*/*/*/mlp.csv")):
        gpu = catalogue_gpu_of("cuda", csv.parts[-4])
        spec = layer_spec(csv)
        for tp in sorted(pd.read_csv(csv,
                                     usecols=["num_tensor_parallel_workers"])["num_tensor_parallel_workers"]
                         .unique()):
            try:
                p = load_operator_profile(root, spec, gpu, int(tp))
            except InputError:  # a TP degree without an all-reduce measured (A40): not compared
                p = None
            if p is None or Path(p.model_dir).name != csv.parent.name:
                continue
            keep = p.tokens <= MAX_TOKENS
            out.append(Measured(gpu, csv.parent.name, spec, int(tp), p.tokens[keep],
                                {k: v[keep] for k, v in p.operators.items()}, p.allreduce))
    return out


def op_params(spec: ModelSpec, tp: int) -> dict[str, float]:
    """Weights of each linear operator on one GPU of a TP group (Megatron split; KV heads replicated below
    1)."""
    h, d = spec.hidden_size, spec.head_dim
    kv = max(1, spec.num_kv_heads // tp)
    mlp_in = (spec.mlp_matrices - 1) * h * spec.intermediate_size / tp
    return {"qkv": h * d * (spec.num_heads // tp + 2 * kv), "o": spec.num_heads // tp * d * h,
            "gate_up": mlp_in, "down": h * spec.intermediate_size / tp}


def roofline(m: Measured, **kw) -> Roofline:
    return Roofline(m.spec, get_gpu(m.gpu), tp=m.tp, **kw)


def predicted(m: Measured, rf: Roofline) -> dict[str, np.ndarray]:
    """The roofline's time of each class at the measured counts."""
    par = op_params(m.spec, m.tp)
    out = {k: np.array([rf.gemm(par[k], int(t)) for t in m.tokens]) for k in LINEARS}
    # as the roofline prices a layer's linears: one blend over their weights, each GEMM's latency
    out["linears"] = np.array([rf.gemm(rf.linear_params_per_gpu, int(t))
                               + (GEMMS_PER_LAYER - 1) * rf.gemm_latency_s
                               for t in m.tokens])
    # a norm streams its input and output once (bytes at the memory efficiency)
    out["norm"] = 2 * m.tokens * m.spec.hidden_size * rf.dtype_bytes / (rf.gpu.mem_bandwidth * rf.mbu)
    return out


def measured(m: Measured) -> dict[str, np.ndarray]:
    out = {k: m.ops[v] for k, v in LINEARS.items()}
    out["linears"] = sum(m.ops[v] for v in LINEARS.values())
    out["norm"] = m.ops["input_layernorm"]
    return out


def errors(ms: list[Measured], kw_of) -> pd.DataFrame:
    rows = []
    for m in ms:
        pred, meas = predicted(m, roofline(m, **kw_of(m.gpu))), measured(m)
        for k in pred:
            rows += [(m.gpu, m.model, m.tp, int(t), k, p / y - 1)
                     for t, p, y in zip(m.tokens, pred[k], meas[k])]
    return pd.DataFrame(rows, columns=["gpu", "model", "tp", "tokens", "op", "err"])


def fit_gpu(ms: list[Measured]) -> dict[str, float]:
    """mfu, mbu and a per-GEMM latency from the TRAIN models' layer linears (log-ratio least squares)."""
    def fun(x: np.ndarray) -> np.ndarray:
        kw = {"mfu": x[0], "mbu": x[1], "gemm_latency_s": x[2] * 1e-6}
        return np.concatenate([np.log(predicted(m, roofline(m, **kw))["linears"] / measured(m)["linears"])
                               for m in ms])
    sol = least_squares(fun, [0.7, 0.75, 5.0], bounds=([0.05, 0.05, 0.0], [1.0, 1.0, 100.0]), diff_step=1e-4)
    return {"mfu": round(float(sol.x[0]), 3), "mbu": round(float(sol.x[1]), 3),
            "gemm_latency_s": round(float(sol.x[2]), 2) * 1e-6}


# the catalogue's all-reduce before it was fitted per TP degree (one fit per GPU over tp 2 and 4)
PREVIOUS_AR = {"a100-80gb": {"allreduce_efficiency": 0.549, "allreduce_latency_s": 41.4e-6},
               "h100": {"allreduce_efficiency": 0.797, "allreduce_latency_s": 29.5e-6}}
LATENCY_BOUND = 1 << 20  # bytes: below, NCCL's small-message regime (protocol switches, bimodal times)


def allreduce_errors(ms: list[Measured], kw_of, held: bool | None = None) -> pd.DataFrame:
    """The roofline's ring all-reduce (`Roofline.allreduce_time`) against the measured collective; `held`:
    only the odd-numbered (True) or even-numbered (False) message sizes, which fit and check apart."""
    rows, seen = [], set()
    for m in ms:
        if m.allreduce is None or (m.gpu, m.tp) in seen:
            continue
        seen.add((m.gpu, m.tp))
        rf = roofline(m, **kw_of(m.gpu, m.tp))
        sizes, secs = m.allreduce
        for i, (b, y) in enumerate(zip(sizes, secs)):
            # the messages of up to 4096 tokens of the widest model here
            if b <= MAX_TOKENS * 8192 * 2 and (held is None or i % 2 == held):
                rows.append((m.gpu, m.tp, b, "< 1 MiB" if b < LATENCY_BOUND else ">= 1 MiB",
                             rf.allreduce_time(b) / y - 1))
    return pd.DataFrame(rows, columns=["gpu", "tp", "bytes", "messages", "err"])


def fit_allreduce(ms: list[Measured]) -> dict[str, float]:
    """The link's efficiency and the all-reduce latency of one GPU and TP degree, from its even-numbered
    message sizes (log-ratio least squares)."""
    def fun(x: np.ndarray) -> np.ndarray:
        kw = {"allreduce_efficiency": x[0], "allreduce_latency_s": x[1] * 1e-6}
        return np.log1p(allreduce_errors(ms, lambda gpu, tp: kw, held=False)["err"].to_numpy())
    sol = least_squares(fun, [0.5, 10.0], bounds=([0.01, 0.0], [1.0, 200.0]), diff_step=1e-4)
    return {"allreduce_efficiency": round(float(sol.x[0]), 3),
            "allreduce_latency_s": round(float(sol.x[1]), 1) * 1e-6}


# layers of each profiled model (its config.json), for the fitted model's per-iteration curve
LAYERS = {"Llama-2-7b-hf": 32, "Llama-2-70b-hf": 80, "Meta-Llama-3-8B": 32, "Meta-Llama-3-70B": 80,
          "CodeLlama-34b-Instruct-hf": 48, "internlm-20b": 60, "Qwen-72B": 80}


# What the measured linear curves show (from this data; the tile models below were fitted on TRAIN, checked on
# the held-out models, and are not in the roofline because they did worse there)
LINEAR_FINDINGS = [
    "## What the measured linear curves show", "",
    ("- Achieved FLOP/s against tokens is a sawtooth, not a knee: it rises linearly while a wave of tiles "
     "fills the SMs and drops where one more row of tiles starts a new wave (H100 down, N 8192: 880 -> "
     "~400 TFLOP/s from 512 to 520 tokens, as 128x256 tiles on 132 SMs predict; A100: the drop at 384 "
     "tokens). The teeth reach -40% of the smooth roofline and sit at token counts set by N and the "
     "kernel cuBLAS picks for each shape, which differs between shapes."),
    ("- Priced physically with one tile per GPU (waves = ceil(ceil(T/tm) ceil(N/tn) / SMs); 128x256, "
     "128x128 or 256x128; with or without split-K under one wave), refitted on the fitted models, the "
     "held-out P5..P95 of the four linears widened (A100 -15..+13% to -18..+45% at best, H100 -22..+18% "
     "to -23..+21%); the best of those tiles per shape did no better (A100 -17..+21%, H100 -24..+18%): a "
     "drop predicted at the wrong token count costs more than none. Token-tile rules (round above 16, 32, "
     "64, 128 or 256 tokens; pad half a tile) all land within 1-2 points of the catalogue's."),
    ("- Below ~64 tokens the operators are weight streaming: A100 ~4 us + bytes / 1.6 TB/s, so the "
     "single per-GEMM latency (fitted with the compute-bound wave tails in it) overprices the smallest "
     "weights (an O projection at tp 8, 4 MB: +34%)."),
    ("- Rechecked per operator (each GEMM's own shape K x N, fitted on TRAIN, checked on the rest; held-out "
     "P5..P95; the H100 at its kernel-fit mbu 0.994, before issue 39; not rerun at 0.856): the catalogue's "
     "form A100 -15.5..+11.8%, A40 -21.5..+14.1%, H100 -22.1..+17.9%; adding "
     "the activations' bytes read and written (T (K + N) x 2 per GEMM) to the weight reads: -15.2..+12.2%, "
     "-21.4..+14.1%, -21.6..+18.2% (largest error 58 -> 51% on H100, 57 -> 47% on A100) and the layer "
     "blend unchanged to 0.2 points, so the roofline keeps weights-only reads; a fitted blend exponent "
     "(sqrt is 2) or a 64- or 32-row token tile: within 1.5 points; waves of one tile per GPU with the "
     "activations' bytes (128x128, 128x256; 108, 132, 84 SMs): A100 -17.6..+30.1%, H100 -23.3..+19.0%; "
     "the best of five tiles per shape and count: A100 -15.9..+13.3%, H100 -22.0..+17.4%. Summing a "
     "blend per GEMM equals the one blend over the layer (compute over memory is T x bw / FLOP/s for "
     "every GEMM)."),
    ("- (Measured at the H100's kernel-fit mbu 0.994, before issue 39; not rerun at 0.856.) "
     "Where the held-out H100 layer misses: 256..1024 tokens (P5 -21..-22%; the teeth after 512, 768, "
     "1024 of the large-N GEMMs) and 128..256 (P95 +16%: the roofline's 128-row rounding where the kernels "
     "use smaller tiles); below 128 tokens and above 1024 it is within -12..+10%. The floor below shows "
     "that even a non-decreasing curve fitted to each H100 shape alone leaves P5..P95 -6.8..+6.6% (down "
     "-9.8..+9.4%, 9% of its points beyond 10%), so the target (every operator within 10% at every count) "
     "is out of reach of any model monotone in tokens on H100."),
    ("- Two latencies (weight streaming apart from compute-bound) or a shape term (K0, N0: small K or N "
     "reach less of the peak; A100 fits K0 48, N0 101; H100 N0 219) move the held-out per-GEMM MAPE by at "
     "most 0.4 points and the share within 10% by -1..+2 points (`Candidate GEMM forms`). Two latencies do "
     "what the physics says at small counts (H100 held-out O projections below 64 tokens: median +8.6% -> "
     "+5.0%, 4.6 us for a weight-streaming GEMM against 8.0 us for a compute-bound one), but the misses "
     "that set the tails are the teeth above 64 tokens, which no smooth form places."),
    ("So the linears' tails are the per-shape kernel choice, which a GEMM model with one tile cannot "
     "place; `simctl fit` on a profile (which interpolates the measured curve) is the way to get them."),
    "",
]


# What is now within target and what cannot be (from the tables below)
STATUS = [
    "## Where issue #22's targets stand", "",
    ("- (a) Linear operators within 10% at 1..4096 tokens: not met, and not reachable by this roofline. "
     "Held-out P5..P95 per GEMM A100 -15.5..+11.8% (78% of points within 10%), A40 -21.5..+14.1% (80%), H100 "
     "-20.5..+20.7% (62%); the layer's linears, as the roofline prices them, -8.4..+7.6% (93%), -9.4..+9.7% "
     "(91%), -14.9..+12.9% (80%). The H100's figures are at the catalogue's mbu since issue 39, 0.856, "
     "fitted to served decode (at its kernel fit here, 0.994: -22.0..+17.9% (65%) and -16.5..+9.2% (84%)). "
     "The misses are the measured sawtooth of cuBLAS's kernel choice (a count "
     "slower than larger ones, teeth of 20-40% at shape-dependent counts) and the 128-row rounding just "
     "above 128 tokens, where the kernels use smaller tiles. Four physical refinements (two latencies for "
     "weight-streaming and compute-bound kernels, a shape term K0/N0 for small K or N, both, and a per-GEMM "
     "refit) were fitted on the TRAIN models and checked held out (`Candidate GEMM forms` below): none "
     "improves every GPU per GEMM and per layer (the shape term: +1..+2 points within 10% per GEMM on A100 "
     "and A40, +5 on the H100 against 0.856, but the A40 layer's share within 10% 91 -> 90%, and against "
     "the H100's kernel-fit mbu 0.994 its layer's MAPE 5.9 -> 6.1%), so the catalogue is unchanged and the "
     "golden results with it. The floor below: even the best non-decreasing curve fitted to each H100 "
     "shape alone leaves 9% of H100 down-projection points beyond 10%."),
    ("- All-reduce within 15%: met at >= 1 MiB on A100 tp 2 and H100 tp 8 (held-out P5..P95 within 10%), "
     "not on A100 tp 4 (P5 -15.7%), A100 tp 8 (P95 +19.4%), H100 tp 2 (-17.4..+14.4%, min -37%) or H100 "
     "tp 4 (P95 +17.3%); below 1 MiB the measured medians at neighbouring sizes fall in two clusters 2-5x "
     "apart, which no function of the size can follow (the floor below)."),
    ("- (b) A fitted model within 5% of held-out points: `simctl fit` on these profiles, held-out iteration "
     "MAPE 1.2-1.6%, P95 of the median fit 3.5-4.3%. The worst fits were the small models at tp > 1, where "
     "all-reduces are 20-46% of an iteration: without them their P95 is 3.1-5.0% (`The worst fits` below). "
     "The fit now sums the collective averaged over 5 neighbouring message sizes (its expected time where "
     "the medians are bimodal): worst H100 fit 12.6% -> 7.7% P95 (Llama-2-7b tp 2: 6.9%); A100's worst "
     "stays 10.9% (Llama-2-7b tp 8: there the slow cluster holds 41% of the sizes below 1 MiB, in runs of "
     "up to 15 consecutive sizes, beyond a local average), and the `all_reduce` class's own held-out "
     "error, a single bimodal size against the average, got worse on H100 (median P95 7.8% -> 11.3%); "
     "A100's median fit 3.8% -> 3.9%, its Llama-2-70b tp 8 6.5% -> 7.7%. The operator curves alone miss "
     "by up to 10.8% P95 (H100 CodeLlama-34b tp 4) where a kernel switch makes a few counts faster than "
     "smaller ones, which the fit's monotone curve does not follow by design."),
    ("- (c) `simctl run` speed: the roofline and the run path are unchanged (the fit's change is in "
     "`profiler/fit_operators.py`, used only by `simctl fit`)."),
]


def floors_section(ms: list[Measured]) -> list[str]:
    """What a model of the roofline's form cannot beat: per measured curve, the best curve non-decreasing in
    tokens (isotonic least squares of log time, fitted to that curve alone); per all-reduce size, the median
    of the two sizes measured either side of it (a local smooth estimate from the measurements)."""
    lin = []
    for m in ms:
        for k, v in LINEARS.items():
            y = np.log(m.ops[v])
            lin += [(m.gpu, k, e) for e in np.expm1(isotonic_regression(y).x - y)]
    ar, seen = [], set()
    for m in ms:
        if m.allreduce is None or (m.gpu, m.tp) in seen:
            continue
        seen.add((m.gpu, m.tp))
        sizes, secs = (a[m.allreduce[0] <= MAX_TOKENS * 8192 * 2] for a in m.allreduce)
        for i in range(2, len(secs) - 2):
            ar.append((m.gpu, m.tp, "< 1 MiB" if sizes[i] < LATENCY_BOUND else ">= 1 MiB",
                       np.median(np.r_[secs[i - 2:i], secs[i + 1:i + 3]]) / secs[i] - 1))
    return ["## The floor: what a model monotone in tokens (or smooth in message size) cannot beat", "",
            ("Linears: each measured curve against the best non-decreasing curve fitted to it alone (every "
             "model, TP degree, 1..4096 tokens). The roofline is non-decreasing in tokens, so on these "
             "points it cannot do better even with per-shape efficiencies: the wave teeth (a count slower "
             "than larger ones) are the floor."), "",
            summary_table(pd.DataFrame(lin, columns=["gpu", "op", "err"]), ["gpu", "op"]), "",
            ("All-reduce: the median of the two sizes either side of each measured size against it. Below "
             "1 MiB neighbouring sizes differ 2-5x (two clusters, e.g. H100 tp 2: ~8 us and ~40 us at "
             "neighbouring sizes; A100 tp 4: ~22 and ~60 us), so even a local smooth estimate misses their "
             "tails by far more than 15%; the roofline's latency sits between the clusters."), "",
            summary_table(pd.DataFrame(ar, columns=["gpu", "tp", "messages", "err"]),
                          ["gpu", "tp", "messages"]), ""]


def fitted_model_section(root: Path, ms: list[Measured]) -> list[str]:
    """`simctl fit`'s cost model (profiler.fit_operators) fitted to each profile with 20% of its token counts
    held out (seed 0), and its error on them: the held-out check the fit reports."""
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for m in ms:
            spec = dataclasses.replace(m.spec, num_layers=LAYERS[m.model])
            rep = fit_operator_profile(root, spec, m.gpu, m.tp, out=Path(tmp) / f"{m.gpu}-{m.model}-{m.tp}")
            rows += [(m.gpu, k, s.n, s.mape, s.p95) for k, s in rep.holdout.items()]
    df = pd.DataFrame(rows, columns=["gpu", "class", "n", "mape", "p95"])
    g = df.groupby(["gpu", "class"])
    t = pd.DataFrame({"fits": g.size(), "points": g["n"].sum(), "MAPE (mean)": g["mape"].mean(),
                      "P95 APE (median fit)": g["p95"].median(), "P95 APE (worst fit)": g["p95"].max()})
    fmt = {c: "{:.1%}".format for c in ("MAPE (mean)", "P95 APE (median fit)", "P95 APE (worst fit)")}
    return ["## `simctl fit` on these profiles: error on its held-out token counts", "",
            ("Every model, GPU and TP degree above, fitted with 20% of the interior token counts held out "
             "(seed 0); absolute errors on them. `iteration`: the cost model's linear curve (every profiled "
             "operator of an iteration, all-reduces included) as it prices the held-out counts. The curve "
             "steps at 64-row tile boundaries (`simctl.profiler.fit_operators.tile_step_knots`) and sums the "
             "collective averaged over 5 neighbouring message sizes (`smoothed_collective`; `all_reduce`: "
             "held-out sizes against that average of the others). Before the average, `iteration` was: P95 "
             "APE (median fit / worst fit) A100 3.8% / 10.9%, A40 3.5% / 4.7%, H100 4.4% / 12.6%; MAPE "
             "1.4%, 1.2%, 1.7%; `all_reduce` (interpolated in the raw sizes): MAPE 4.3% / 4.0%, P95 "
             "median 24.2% / 7.8%, worst 25.5% / 47.1% (A100 / H100). Before the tile steps: A100 5.9% / "
             "10.7%, A40 6.1% / 7.2%, H100 7.7% / 12.6%; MAPE 1.7%, 1.8%, 2.3%."), "",
            _md(t, fmt), ""]


def summary_table(df: pd.DataFrame, by: list[str]) -> str:
    g = df.groupby(by)["err"]
    t = pd.DataFrame({"points": g.size(), "P5": g.quantile(0.05), "median": g.median(),
                      "P95": g.quantile(0.95), "min": g.min(), "max": g.max(),
                      "MAPE": g.apply(lambda e: e.abs().mean()),
                      "within 10%": g.apply(lambda e: (e.abs() <= 0.10).mean())})
    fmt = {c: "{:+.1%}".format for c in ("P5", "median", "P95", "min", "max")}
    fmt.update({"MAPE": "{:.1%}".format, "within 10%": "{:.0%}".format})
    return _md(t, fmt)


def _md(t: pd.DataFrame, fmt: dict) -> str:
    t = t.copy()
    for c, f in fmt.items():
        t[c] = t[c].map(f)
    t = t.reset_index()
    rows = [list(map(str, t.columns)), ["---"] * len(t.columns), *(list(map(str, r)) for r in t.to_numpy())]
    return "\n".join("| " + " | ".join(r) + " |" for r in rows)


def _layer_panel(ax, before: pd.DataFrame, after: pd.DataFrame, gpu: str) -> None:
    for df, style, label in ((before, ":", "before"), (after, "-", "after")):
        d = df[(df["gpu"] == gpu) & (df["op"] == "linears")]
        for held, color in ((False, "tab:blue"), (True, "tab:red")):
            dd = d[d["model"].isin(TRAIN) != held].groupby("tokens")["err"]
            ax.plot(dd.median().index, 100 * dd.median(), style, color=color,
                    label=f"{label}, {'held-out' if held else 'fitted'} models (median)")
            if style == "-":
                ax.fill_between(dd.median().index, 100 * dd.quantile(0.05), 100 * dd.quantile(0.95),
                                color=color, alpha=0.15)
    ax.set_title(f"{gpu}: layer linears, roofline vs measured")


def _ops_panel(ax, forms: list, gpu: str, points: pd.DataFrame) -> None:
    """Held-out per-operator median error against tokens: the catalogue (solid), the shape form (dashed)."""
    held = points[(points["gpu"] == gpu) & ~points["train"]]
    for r in forms:
        if r.gpu != gpu or r.form not in ("catalogue", FORMS[2].name):
            continue
        d = pd.DataFrame({"op": r.per_op["op"].to_numpy(), "tokens": held["tokens"].to_numpy(),
                          "err": r.per_op["err"].to_numpy()})
        for (op, g), color in zip(d.groupby("op"), ("tab:blue", "tab:orange", "tab:green", "tab:red")):
            m = g.groupby("tokens")["err"].median()
            ax.plot(m.index, 100 * m, "-" if r.form == "catalogue" else "--", color=color, lw=1,
                    label=f"{op}, {r.form}")
    ax.set_title(f"{gpu}: held-out operators (median over models, TP)")


def figure(before: pd.DataFrame, after: pd.DataFrame, forms: list, points: pd.DataFrame, path: Path) -> None:
    gpus = sorted(after["gpu"].unique())
    fig, axes = plt.subplots(2, len(gpus), figsize=(5 * len(gpus), 8), sharey=True, squeeze=False)
    for j, gpu in enumerate(gpus):
        _layer_panel(axes[0, j], before, after, gpu)
        _ops_panel(axes[1, j], forms, gpu, points)
    for ax in axes.ravel():
        ax.axhspan(-10, 10, color="0.9", zorder=0)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    axes[0, 0].set_ylabel("roofline / measured - 1 (%); band: P5-P95 after")
    axes[1, 0].set_ylabel("roofline / measured - 1 (%)")
    axes[0, 0].legend(fontsize=7)
    axes[1, 0].legend(fontsize=6, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def allreduce_section(ms: list[Measured]) -> list[str]:
    ar_fit = {(m.gpu, m.tp): fit_allreduce([m]) for m in ms if m.allreduce is not None}
    ar = allreduce_errors(ms, lambda gpu, tp: {}, held=True)  # the catalogue as it now is
    ar_before = allreduce_errors(ms, lambda gpu, tp: PREVIOUS_AR[gpu], held=True)
    return [
        ("## All-reduce: ring 2 (tp - 1) / tp x bytes / (link x efficiency) + latency, against the measured "
         "one"),
        "", ("Per GPU and TP degree, fitted on the even-numbered message sizes up to 4096 tokens x 8192 x 2 "
             "bytes (NVSwitch systems, `*_dgx`, as `simctl fit` picks), checked on the odd-numbered "
             "ones; now in `catalogue/gpus.py`:"),
        "", "| gpu | tp | efficiency | latency (us) |", "|---|---|---|---|",
        *(f"| {g} | {tp} | {v['allreduce_efficiency']} | {v['allreduce_latency_s'] * 1e6:.1f} |"
          for (g, tp), v in sorted(ar_fit.items())),
        "", summary_table(ar, ["gpu", "tp", "messages"]), "",
        "Before (one efficiency and latency per GPU, fitted on tp 2 and 4), the same held-out sizes:", "",
        summary_table(ar_before, ["gpu", "tp", "messages"]), ""]


def catalogue_values(gpu: str) -> dict[str, float]:
    """The catalogue's GEMM constants in `roofline_forms`' terms (one latency, no shape term)."""
    g = get_gpu(gpu)
    lat = (g.gemm_latency_s or 0.0) * 1e6
    return {"mfu": g.mfu, "mbu": g.mbu, "l_mem_us": lat, "l_comp_us": lat, "k0": 0.0, "n0": 0.0}


def candidate_forms_section(forms: list) -> list[str]:
    return ["## Candidate GEMM forms, per operator (fitted on the TRAIN models' GEMMs, checked on the rest)",
            "",
            ("`bench/roofline_forms.py`: t = sqrt(c^2 + m^2) + L_mem + (L_comp - L_mem) x s, with s = "
             "c^2 / (c^2 + m^2) the compute-bound share, c = 2 T_tiled (K N + K0 N + N0 K) / (peak x mfu) "
             "and m = 2 K N / (bandwidth x mbu). The catalogue's form has one latency and K0 = N0 = 0 (its "
             "values, fitted on the layer sum, as they are); `refitted`: the same form fitted per GEMM; "
             "`two latencies`: weight-streaming kernels' fixed time apart from the compute-bound ones' "
             "(their wave tails); `shape`: K0 and N0, the extra work of a tile's prologue/epilogue and of "
             "partly filled tile columns, so that small K or N reach less of the peak. Each GEMM's error, "
             "and the layer's as the roofline prices it (one blend over the four GEMMs, each GEMM's "
             "latency)."),
            "", *forms_section(forms)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=REFERENCE)
    args = ap.parse_args()
    ms = measurements(args.root)
    fitted = {gpu: fit_gpu([m for m in ms if m.gpu == gpu and m.model in TRAIN])
              for gpu in sorted({m.gpu for m in ms})}
    defaults = {"mfu": 0.70, "mbu": 0.75, "gemm_latency_s": 0.0}  # the roofline before this bench
    before = errors(ms, lambda gpu: defaults)
    after = errors(ms, lambda gpu: {})  # the catalogue as it now is
    after["models"] = np.where(after["model"].isin(TRAIN), "fitted", "held out")
    before["models"] = np.where(before["model"].isin(TRAIN), "fitted", "held out")
    points = gemm_points(ms, LINEARS, TRAIN)
    forms = compare_forms(points, catalogue_values)
    figure(before, after, forms, points, OUT.with_suffix(".png"))
    lin = ["qkv", "o", "gate_up", "down", "linears"]
    lines = [
        "# The roofline against measured GPU operator times", "",
        (f"`python bench/roofline_vs_measured.py` on {args.root.name} (Vidur's published profiles: A100, "
        f"H100, A40; every model and TP degree, 1..{MAX_TOKENS} tokens). Error = roofline / measured median "
        "- 1."), "", *STATUS, "",
        (f"Fitted per GPU on {', '.join(TRAIN)} only (the `linears` row: one blend over a layer's linears, "
        "as the roofline prices them); every other model is held out. Fitted values (now in "
         "`catalogue/gpus.py`, but for the H100's mbu: 0.856 since issue 39, fitted to served decode):"),
        "", "| gpu | mfu | mbu | gemm latency (us) |", "|---|---|---|---|",
        *(f"| {g} | {v['mfu']} | {v['mbu']} | {v['gemm_latency_s'] * 1e6:.2f} |" for g, v in fitted.items()),
        "", "## Linear operators, held-out models, with the catalogue's efficiencies", "",
        summary_table(after[(after["models"] == "held out") & after["op"].isin(lin)], ["gpu", "op"]), "",
        "## Linear operators, fitted models", "",
        summary_table(after[(after["models"] == "fitted") & after["op"].isin(lin)], ["gpu", "op"]), "",
        "## Before: mfu 0.70, mbu 0.75, no GEMM latency (all models)", "",
        summary_table(before[before["op"].isin(lin)], ["gpu", "op"]), "",
        "## Per held-out model: the layer's linears", "",
        summary_table(after[(after["models"] == "held out") & (after["op"] == "linears")], ["gpu", "model"]),
        "", *candidate_forms_section(forms), *LINEAR_FINDINGS,
        "## Norms (memory roofline: input and output streamed once; the roofline does not price norms)",
        "", summary_table(after[after["op"] == "norm"], ["gpu"]), "",
        *allreduce_section(ms), *floors_section(ms), *fitted_model_section(args.root, ms),
        *worst_fits_section(args.root, ms, LAYERS),
    ]
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(fitted)


if __name__ == "__main__":
    main()
