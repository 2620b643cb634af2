"""The roofline checked against real GPU operator times (Vidur's, ../shared/reference/gpu_profiles).

    python bench/roofline_vs_measured.py [--root ../shared/reference/gpu_profiles]

Per GPU (A100, H100, A40), per operator class (QKV, O, gate+up, down, the layer's linears as the roofline
prices them: one blend over their sum, norms, all-reduce, attention where measured), every model and TP degree
at 1..4096 tokens: the roofline's time against the measured median, as signed errors (roofline / measured -
1).

The efficiencies the catalogue now holds per GPU (`catalogue.gpus`: mfu, mbu, gemm_latency_s) are fitted here
on the TRAIN models only (least squares of log(roofline / measured) of the layer's linears), and the errors
are reported apart on the models they were not fitted on. Writes bench/results/roofline_vs_measured.md and
.png. """

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from catalogue.gpus import catalogue_gpu_of, get_gpu
from catalogue.models import ModelSpec
from common.errors import InputError
from costs.gpu_share import GEMMS_PER_LAYER
from costs.roofline import Roofline
from profiler.operator_profiles import load_operator_profile

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


AR_TRAIN_TP = (2, 4)  # the all-reduce is fitted on these degrees and checked on 8


def allreduce_errors(ms: list[Measured], kw_of) -> pd.DataFrame:
    """The roofline's ring all-reduce (`Roofline.allreduce_time`) against the measured collective."""
    rows, seen = [], set()
    for m in ms:
        if m.allreduce is None or (m.gpu, m.tp) in seen:
            continue
        seen.add((m.gpu, m.tp))
        rf = roofline(m, **kw_of(m.gpu))
        sizes, secs = m.allreduce
        for b, y in zip(sizes, secs):
            if b <= MAX_TOKENS * 8192 * 2:  # the messages of up to 4096 tokens of the widest model here
                rows.append((m.gpu, m.tp, b, rf.allreduce_time(b) / y - 1))
    return pd.DataFrame(rows, columns=["gpu", "tp", "bytes", "err"])


def fit_allreduce(ms: list[Measured]) -> dict[str, float]:
    """The link's efficiency and the per-all-reduce latency from the degrees in AR_TRAIN_TP."""
    def fun(x: np.ndarray) -> np.ndarray:
        kw = {"allreduce_efficiency": x[0], "allreduce_latency_s": x[1] * 1e-6}
        df = allreduce_errors([m for m in ms if m.tp in AR_TRAIN_TP], lambda gpu: kw)
        return np.log1p(df["err"].to_numpy())
    sol = least_squares(fun, [0.5, 10.0], bounds=([0.01, 0.0], [1.0, 200.0]), diff_step=1e-4)
    return {"allreduce_efficiency": round(float(sol.x[0]), 3),
            "allreduce_latency_s": round(float(sol.x[1]), 1) * 1e-6}


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


def figure(before: pd.DataFrame, after: pd.DataFrame, path: Path) -> None:
    gpus = sorted(after["gpu"].unique())
    fig, axes = plt.subplots(1, len(gpus), figsize=(5 * len(gpus), 4), sharey=True)
    for ax, gpu in zip(np.atleast_1d(axes), gpus):
        for df, style, label in ((before, ":", "before"), (after, "-", "after")):
            d = df[(df["gpu"] == gpu) & (df["op"] == "linears")]
            for held, color in ((False, "tab:blue"), (True, "tab:red")):
                dd = d[d["model"].isin(TRAIN) != held].groupby("tokens")["err"]
                ax.plot(dd.median().index, 100 * dd.median(), style, color=color,
                        label=f"{label}, {'held-out' if held else 'fitted'} models (median)")
                if style == "-":
                    ax.fill_between(dd.median().index, 100 * dd.quantile(0.05), 100 * dd.quantile(0.95),
                                    color=color, alpha=0.15)
        ax.axhspan(-10, 10, color="0.9", zorder=0)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{gpu}: layer linears, roofline vs measured")
        ax.set_xlabel("tokens")
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("roofline / measured - 1 (%); band: P5-P95 after")
    np.atleast_1d(axes)[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


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
    ar_fit = {gpu: fit_allreduce([m for m in ms if m.gpu == gpu]) for gpu in sorted({m.gpu for m in ms})
              if any(m.gpu == gpu and m.allreduce is not None for m in ms)}
    ar_before = allreduce_errors(ms, lambda gpu: {"allreduce_efficiency": 1.0, "allreduce_latency_s": 10e-6})
    ar = allreduce_errors(ms, lambda gpu: {})
    figure(before, after, OUT.with_suffix(".png"))
    lin = ["qkv", "o", "gate_up", "down", "linears"]
    lines = [
        "# The roofline against measured GPU operator times", "",
        (f"`python bench/roofline_vs_measured.py` on {args.root.name} (Vidur's published profiles: A100, "
        f"H100, A40; every model and TP degree, 1..{MAX_TOKENS} tokens). Error = roofline / measured median "
        "- 1."), "",
        (f"Fitted per GPU on {', '.join(TRAIN)} only (the `linears` row: one blend over a layer's linears, "
        "as the roofline prices them); every other model is held out. Fitted values (now in "
         "`catalogue/gpus.py`):"),
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
        "", "## Norms (memory roofline: input and output streamed once; the roofline does not price norms)",
        "", summary_table(after[after["op"] == "norm"], ["gpu"]), "",
        ("## All-reduce: ring 2 (tp - 1) / tp x bytes / (link x efficiency) + latency, against the measured "
         "one"),
        "", (f"Fitted on tp {AR_TRAIN_TP} (held out: tp 8), messages up to 4096 tokens x 8192 x 2 bytes "
        "(NVSwitch systems, `*_dgx`, as `simctl fit` picks): efficiency and latency now in "
        "`catalogue/gpus.py`:"),
        "", "| gpu | efficiency | latency (us) |", "|---|---|---|",
        *(f"| {g} | {v['allreduce_efficiency']} | {v['allreduce_latency_s'] * 1e6:.1f} |"
          for g, v in ar_fit.items()),
        "", summary_table(ar, ["gpu", "tp"]), "",
        "Before (peak link, 10 us):", "", summary_table(ar_before, ["gpu", "tp"]), "",
    ]
    OUT.with_suffix(".md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))
    print(fitted, ar_fit)


if __name__ == "__main__":
    main()
