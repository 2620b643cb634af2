"""Candidate forms of the roofline's GEMM price, checked per operator against Vidur's measured operator times
(imported by bench/roofline_vs_measured.py, which writes the results).

Each GEMM (QKV, O, gate+up, down of one GPU's share: K x N weights) over T token rows is priced as
    t = sqrt(c^2 + m^2) + L_mem + (L_comp - L_mem) x s,   s = c^2 / (c^2 + m^2) (the compute-bound share),
    c = 2 T_tiled (K N + K0 N + N0 K) / (peak x mfu),   m = 2 K N / (bandwidth x mbu)   (fp16 weights, once).
The catalogue's form is L_mem = L_comp (one per-GEMM latency) and K0 = N0 = 0. The candidates free:
- two latencies: a weight-streaming kernel's fixed time (L_mem; the measured small-token GEMMs are ~4 us +
  bytes / 1.6 TB/s on an A100) apart from the compute-bound kernels' (L_comp: their wave tails);
- shape: K0 and N0, the work a tile pays beyond its share of the FLOPs (K0: a tile's prologue and epilogue
  in units of K; N0: the columns of partly filled tile columns and waves), so that a GEMM with a small K or N
  (an O projection at tp 8: K 512; a QKV at tp 8: N 768..1920) reaches less of the peak;
- both.
Each is fitted per GPU on the TRAIN models' four GEMMs (least squares of log(priced / measured)) and checked
on the held-out models, per operator and as the roofline prices a layer (one blend over the four GEMMs' summed
compute and reads, plus each GEMM's latency at the layer's compute share).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simctl.catalogue.gpus import GPUSpec, get_gpu

OPS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class Form:
    name: str
    params: tuple[str, ...]  # the fitted ones, among mfu, mbu, l_mem_us, l_comp_us, k0, n0
    x0: tuple[float, ...]
    lower: tuple[float, ...]
    upper: tuple[float, ...]


FORMS = (
    Form("catalogue form, refitted", ("mfu", "mbu", "l_mem_us"), (0.7, 0.8, 5.0), (0.05, 0.05, 0.0),
         (1.0, 1.0, 100.0)),
    Form("two latencies", ("mfu", "mbu", "l_mem_us", "l_comp_us"), (0.7, 0.8, 4.0, 8.0),
         (0.05, 0.05, 0.0, 0.0), (1.0, 1.0, 100.0, 100.0)),
    Form("shape (K0, N0)", ("mfu", "mbu", "l_mem_us", "k0", "n0"), (0.7, 0.8, 5.0, 100.0, 100.0),
         (0.05, 0.05, 0.0, 0.0, 0.0), (1.0, 1.0, 100.0, 1e4, 1e4)),
    Form("shape + two latencies", ("mfu", "mbu", "l_mem_us", "l_comp_us", "k0", "n0"),
         (0.7, 0.8, 4.0, 8.0, 100.0, 100.0), (0.05, 0.05, 0.0, 0.0, 0.0, 0.0),
         (1.0, 1.0, 100.0, 100.0, 1e4, 1e4)),
)


def gemm_shapes(spec, tp: int) -> dict[str, tuple[int, int]]:
    """(K, N) of each linear operator on one GPU of a TP group (Megatron split; KV heads replicated below
    1), as `simctl.costs.gpu_share` counts their weights."""
    h, d = spec.hidden_size, spec.head_dim
    kv = max(1, spec.num_kv_heads // tp)
    return {"qkv": (h, d * (spec.num_heads // tp + 2 * kv)), "o": (spec.num_heads // tp * d, h),
            "gate_up": (h, (spec.mlp_matrices - 1) * spec.intermediate_size // tp),
            "down": (spec.intermediate_size // tp, h)}


def gemm_points(ms: list, ops: dict[str, str], train: tuple[str, ...]) -> pd.DataFrame:
    """One row per measured GEMM: gpu, model, tp, op, tokens, K, N, measured seconds, whether TRAIN."""
    cols: dict[str, list] = {k: [] for k in ("gpu", "model", "tp", "op", "tokens", "K", "N", "y")}
    for m in ms:
        for op, (k, n) in gemm_shapes(m.spec, m.tp).items():
            y = m.ops[ops[op]]
            for key, v in (("gpu", m.gpu), ("model", m.model), ("tp", m.tp), ("op", op), ("K", k), ("N", n)):
                cols[key] += [v] * len(y)
            cols["tokens"] += list(m.tokens)
            cols["y"] += list(y)
    df = pd.DataFrame(cols)
    df["train"] = df["model"].isin(train)
    return df


def _values(form: Form, x: np.ndarray) -> dict[str, float]:
    v = {"k0": 0.0, "n0": 0.0, **dict(zip(form.params, x))}
    v.setdefault("l_comp_us", v["l_mem_us"])
    return v


def parts(v: dict[str, float], d: pd.DataFrame, g: GPUSpec, tile: int) -> tuple[np.ndarray, ...]:
    """(c, m, l_mem, l_comp) seconds of each row's GEMM."""
    k, n, t = (d[c].to_numpy(dtype=np.float64) for c in ("K", "N", "tokens"))
    rows = np.where(t <= tile, t, np.ceil(t / tile) * tile)
    c = 2.0 * rows * (k * n + v["k0"] * n + v["n0"] * k) / (g.peak_flops * v["mfu"])
    m = 2.0 * k * n / (g.mem_bandwidth * v["mbu"])
    return c, m, np.full(len(d), v["l_mem_us"] * 1e-6), np.full(len(d), v["l_comp_us"] * 1e-6)


def price(c: np.ndarray, m: np.ndarray, l_mem: np.ndarray, l_comp: np.ndarray) -> np.ndarray:
    s = c * c / (c * c + m * m)
    return np.sqrt(c * c + m * m) + l_mem + (l_comp - l_mem) * s


def fit_form(form: Form, d: pd.DataFrame, g: GPUSpec) -> dict[str, float]:
    def fun(x: np.ndarray) -> np.ndarray:
        return np.log(price(*parts(_values(form, x), d, g, g.tile)) / d["y"].to_numpy())
    sol = least_squares(fun, form.x0, bounds=(form.lower, form.upper), x_scale="jac", diff_step=1e-4)
    return _values(form, sol.x)


def errors(v: dict[str, float], d: pd.DataFrame, g: GPUSpec) -> tuple[np.ndarray, np.ndarray]:
    """Per-GEMM errors (priced / measured - 1) and, per (model, tp, tokens), the layer's as the roofline
    prices it: one blend of the summed compute and reads, each GEMM's latency at the layer's compute share."""
    c, m, lm, lc = parts(v, d, g, g.tile)
    per_op = price(c, m, lm, lc) / d["y"].to_numpy() - 1
    keys = {k: d[k].to_numpy() for k in ("model", "tp", "tokens")}
    s = pd.DataFrame({**keys, "c": c, "m": m, "lm": lm, "lc": lc, "y": d["y"].to_numpy()})
    s = s.groupby(list(keys)).sum()
    layer = price(s["c"].to_numpy(), s["m"].to_numpy(), s["lm"].to_numpy(), s["lc"].to_numpy())
    return per_op, layer / s["y"].to_numpy() - 1


@dataclass(frozen=True)
class FormResult:
    gpu: str
    form: str
    values: dict[str, float]
    per_op: pd.DataFrame  # held-out rows: op, err
    layer: np.ndarray  # held-out layer errors


def compare_forms(points: pd.DataFrame, catalogue: Callable[[str], dict[str, float]]) -> list[FormResult]:
    """Per GPU: the catalogue's values as they are, then each candidate form fitted on TRAIN; their held-out
    errors."""
    out = []
    for gpu, dg in points.groupby("gpu"):
        g = get_gpu(gpu)
        held = dg[~dg["train"]]
        fits = [("catalogue", catalogue(gpu))] + [(f.name, fit_form(f, dg[dg["train"]], g)) for f in FORMS]
        for name, v in fits:
            per_op, layer = errors(v, held, g)
            out.append(FormResult(gpu, name, v, pd.DataFrame({"op": held["op"].to_numpy(), "err": per_op}),
                                  layer))
    return out


def _q(e: np.ndarray) -> str:
    return (f"{np.percentile(e, 5):+.1%}..{np.percentile(e, 95):+.1%}, MAPE {np.abs(e).mean():.1%}, "
            f"{(np.abs(e) <= 0.10).mean():.0%} within 10%")


def _describe(v: dict[str, float]) -> str:
    s = f"mfu {v['mfu']:.3f}, mbu {v['mbu']:.3f}, L {v['l_mem_us']:.2f}"
    s += f"/{v['l_comp_us']:.2f} us" if v["l_comp_us"] != v["l_mem_us"] else " us"
    return s + (f", K0 {v['k0']:.0f}, N0 {v['n0']:.0f}" if v["k0"] or v["n0"] else "")


def improves_everywhere(results: list[FormResult], form: str) -> bool:
    """Whether `form` beats the catalogue on every GPU in held-out MAPE and share within 10%, per operator
    pooled and per layer."""
    by = {(r.gpu, r.form): r for r in results}
    for gpu in {r.gpu for r in results}:
        a, b = by[(gpu, "catalogue")], by[(gpu, form)]
        for ea, eb in ((a.per_op["err"].to_numpy(), b.per_op["err"].to_numpy()), (a.layer, b.layer)):
            if not (np.abs(eb).mean() < np.abs(ea).mean() and (np.abs(eb) <= 0.1).mean()
                    > (np.abs(ea) <= 0.1).mean()):
                return False
    return True


def forms_section(results: list[FormResult]) -> list[str]:
    """The candidate forms' tables: per GPU and form the pooled held-out errors (P5..P95, MAPE, share within
    10%) per operator and per layer; per GPU and operator each form's MAPE / share within 10%."""
    names = ["catalogue", *(f.name for f in FORMS)]
    lines = ["| gpu | form | fitted values | four GEMMs, held out | layer, held out |",
             "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.gpu} | {r.form} | {_describe(r.values)} | {_q(r.per_op['err'].to_numpy())} | "
                     f"{_q(r.layer)} |")
    lines += ["", "Per operator (held out): MAPE / share within 10%", "",
              "| gpu | op | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    by = {(r.gpu, r.form): r for r in results}
    for gpu in sorted({r.gpu for r in results}):
        for op in OPS:
            cells = []
            for n in names:
                e = by[(gpu, n)].per_op.query("op == @op")["err"].to_numpy()
                cells.append(f"{np.abs(e).mean():.1%} / {(np.abs(e) <= 0.1).mean():.0%}")
            lines.append(f"| {gpu} | {op} | " + " | ".join(cells) + " |")
    verdict = [n for n in names[1:] if improves_everywhere(results, n)]
    lines += ["", ("Improves held-out MAPE and the share within 10% on every GPU, per operator and per "
                   "layer: " + (", ".join(verdict) if verdict else "none of the candidates") + "."), ""]
    return lines
