"""Which decode-step form holds across model sizes (7B, 34B, 70B, MoE) at once? (simctl issue 39, item 3.)

    python research/gpu_step_forms.py [--root ../shared/reference/gpu_serving] [--train sync|ci|sync+8b]
        [--forms NAME ...]

research/gpu_decode_terms.py fitted one H100 `mbu` and one per-step host time on Llama-2-7B and CodeLlama-34B
served: serving within 2%, vLLM's CI Llama-3.1-8B case 10% fast. Here each candidate form of the step's
non-roofline time is fitted the same way (least squares of predicted / measured - 1) on one subset and judged
on the rest, all through bench/gpu_serving.py's `cost_model` hook and the public `Roofline` constructor:

- `shipped`: the catalogue's H100 (mbu 0.994, 7.57 us a GEMM) and the 2 ms a step (nothing fitted);
- `fixed`: H100 mbu + one per-step host time (gpu_decode_terms.py's form), every GPU;
- `per_layer`: H100 mbu + a host time per layer (CUDA-graph replay's per-kernel gaps grow with the layers),
  every GPU, no per-step constant;
- `gemm_latency`: H100 mbu + a fixed time per GEMM (the roofline's `gemm_latency_s`, on the GPU: counts a
  sparse layer's extra GEMMs and the LM head), H100 only, no host time;
- `mbu_size`: H100 HBM efficiency falling for small per-GPU weight matrices, mbu = m_max S / (S + S_half),
  S = this GPU's linear weight bytes / its GEMMs (attention's KV reads at m_max), no host time;
- `per_request`: H100 mbu + a host time per scheduled request (sampling, output processing), every GPU, no
  per-step constant;
- `fixed+request`, `layer+request`: a per-step or per-layer host time and a per-request one, with H100 mbu.

`--train sync` (default): fitted on the P50 TPOT of the four files' `synchronous` phases (one request at a
time: two model sizes, four prompt lengths), judged on every other phase and on vLLM's CI latency cases.
`--train ci`: fitted on the CI cases (three models, three GPUs), judged on serving. `--train sync+8b`: the
synchronous phases plus the CI's Llama-3.1-8B H100 case (a batch of 8: it separates per-request from per-step
time), then the H200's own mbu on its Llama-3.1-8B case (`fit_h200`); the other CI cases are held out.
The A100 keeps the catalogue's GPU terms; the H200 takes the H100's per-GEMM time and, outside `sync+8b`, the
catalogue's mbu (0.75, a default: no H200 measurement). Results: research/results/gpu_step_forms.md.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from scipy.optimize import least_squares

from simctl.catalogue.models import ModelSpec, get_model
from simctl.costs.gpu_share import gpu_share
from simctl.costs.roofline import Roofline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_decode_terms import ROOT, bench_module

Terms = Callable[[np.ndarray, ModelSpec, str, int], dict]


H200_MBU: list[float] = []  # the H200's own HBM efficiency once fitted (`fit_h200`), else the catalogue's


def h100(gpu: str, **terms) -> dict:
    """GPU terms fitted on the H100. The H200 (the same GH100 die) takes its per-GEMM time and its own mbu
    (`fit_h200`; carrying the H100's mbu to the HBM3e was tried: its CI cases came out 20-35% fast); the A100
    keeps its catalogue terms (Vidur's kernel times)."""
    if gpu == "h200":
        return {**{k: v for k, v in terms.items() if k == "gemm_latency_s"},
                **({"mbu": H200_MBU[0]} if H200_MBU else {})}
    return terms if gpu == "h100" else {}


def mbu_size(x: np.ndarray, m: ModelSpec, gpu: str, tp: int) -> dict:
    top = x[0] if gpu == "h100" else H200_MBU[0] if gpu == "h200" and H200_MBU else None
    if top is None:
        return {"overhead_s": 0.0}
    share = gpu_share(m, tp)
    size = share.linear_params * 2 / share.gemms  # bytes of this GPU's mean linear weight matrix
    return {"mbu": top * size / (size + x[1] * 1e6), "attn_mbu": top, "overhead_s": 0.0}


@dataclass(frozen=True)
class Form:
    name: str
    params: tuple[str, ...]  # with their units as fitted
    x0: tuple[float, ...]
    bounds: tuple[tuple[float, ...], tuple[float, ...]]
    terms: Terms


FORMS = (
    Form("shipped", (), (), ((), ()), lambda x, m, gpu, tp: {}),
    Form("fixed", ("mbu", "ms/step"), (0.9, 1.0), ((0.5, 0.0), (1.0, 2.0)),
         lambda x, m, gpu, tp: {"overhead_s": x[1] * 1e-3, **h100(gpu, mbu=x[0])}),
    Form("per_layer", ("mbu", "us/layer"), (0.9, 20.0), ((0.5, 0.0), (1.0, 100.0)),
         lambda x, m, gpu, tp: {"overhead_s": x[1] * 1e-6 * m.num_layers, **h100(gpu, mbu=x[0])}),
    Form("gemm_latency", ("mbu", "us/GEMM"), (0.9, 5.0), ((0.5, 0.0), (1.0, 50.0)),
         lambda x, m, gpu, tp: {"overhead_s": 0.0, **h100(gpu, mbu=x[0], gemm_latency_s=x[1] * 1e-6)}),
    Form("mbu_size", ("mbu_max", "S_half MB"), (0.95, 5.0), ((0.5, 0.0), (1.0, 200.0)), mbu_size),
    Form("per_request", ("mbu", "ms/request"), (0.9, 1.0), ((0.5, 0.0), (1.0, 5.0)),
         lambda x, m, gpu, tp: {"overhead_s": 0.0, "request_s": x[1] * 1e-3, **h100(gpu, mbu=x[0])}),
    Form("fixed+request", ("mbu", "ms/step", "ms/request"), (0.9, 0.5, 0.1),
         ((0.5, 0.0, 0.0), (1.0, 2.0, 2.0)),
         lambda x, m, gpu, tp: {"overhead_s": x[1] * 1e-3, "request_s": x[2] * 1e-3, **h100(gpu, mbu=x[0])}),
    Form("layer+request", ("mbu", "us/layer", "ms/request"), (0.9, 20.0, 0.1),
         ((0.5, 0.0, 0.0), (1.0, 100.0, 2.0)),
         lambda x, m, gpu, tp: {"overhead_s": x[1] * 1e-6 * m.num_layers, "request_s": x[2] * 1e-3,
                                **h100(gpu, mbu=x[0])}),
)
H200_TRAIN = (("llama-3.1-8b", "h200", 1),)  # `fit_h200`'s case under sync+8b
TRAIN_CI = {"sync": (), "ci": None, "sync+8b": (("llama-3.1-8b", "h100", 1),)}  # None: every CI case


# simctl's roofline as it was when this was run (before the adoption of `layer+request`, 2026-11-28): 2 ms a
# step, nothing per request, the H100's mbu 0.994 and the H200's default 0.75; a form's terms replace these
BEFORE = {"overhead_s": 2e-3, "request_s": 0.0}
BEFORE_MBU = {"h100": 0.994, "h200": 0.75}


def priced_with(bench, form: Form, x: np.ndarray) -> None:
    def cost_model(model, gpu, tp, allreduce="vllm"):
        m = get_model(model) if isinstance(model, str) else model
        before = {**BEFORE, **({"mbu": BEFORE_MBU[gpu]} if gpu in BEFORE_MBU else {})}
        return Roofline(m, gpu, tp, allreduce=allreduce, **{**before, **form.terms(x, m, gpu, tp)})

    bench.cost_model = cost_model


def sync_phases(bench, root: Path) -> list:
    out = []
    for case in bench.CASES:
        frame = pd.read_csv(root / case.file)
        rows = frame[frame["phase"] == bench.SYNCHRONOUS]
        out.append((case, rows, bench.measured(rows)["tpot"]))
    return out


def fit(bench, root: Path, form: Form, train: str) -> np.ndarray:
    if not form.params:
        return np.empty(0)
    phases = sync_phases(bench, root) if train != "ci" else []
    cases = [c for c in bench.ci_cases((root / "README.md").read_text(encoding="utf-8"))
             if TRAIN_CI[train] is None or c[:3] in TRAIN_CI[train]]

    def residuals(x):
        priced_with(bench, form, x)
        return ([bench.predicted(c, bench.SYNCHRONOUS, r)["tpot"] / t - 1 for c, r, t in phases]
                + [bench.ci_batch_s(m, g, tp, "nccl") / s - 1 for m, g, tp, s in cases])
    sol = least_squares(residuals, x0=list(form.x0), bounds=form.bounds, diff_step=1e-3)
    return sol.x


def fit_h200(bench, root: Path, form: Form, x: np.ndarray) -> float:
    """The H200's mbu under a fitted form: its one parameter fitted on the H200's Llama-3.1-8B CI case only
    (the form's host terms are the engine's, the same as on the H100), its other cases held out."""
    case = next(c for c in bench.ci_cases((root / "README.md").read_text(encoding="utf-8"))
                if c[:3] == ("llama-3.1-8b", "h200", 1))

    def residual(v):
        H200_MBU[:] = [float(v[0])]
        priced_with(bench, form, x)
        return [bench.ci_batch_s(*case[:3], "nccl") / case[3] - 1]
    return float(least_squares(residual, x0=[0.8], bounds=([0.3], [1.0]), diff_step=1e-3).x[0])


def summary(rows: list[dict], ci: list[dict], train: str) -> dict[str, float]:
    """MAPEs (%) of the groups a form is judged on; `held-out` excludes the synchronous phases when they
    trained it."""
    def m(group, metric):
        return float(np.mean([abs(r[f"{metric}_error_pct"]) for r in group])) if group else float("nan")
    unsat = [r for r in rows if not r["saturated"]]
    held = [r for r in unsat if not (train != "ci" and r["phase"] == "synchronous")]
    sat = [r for r in rows if r["saturated"]]
    out = {f"unsat {k}": m(unsat, k) for k in ("ttft", "tpot", "e2e")}
    out.update({f"held-out unsat {k}": m(held, k) for k in ("tpot", "e2e")})
    out.update({f"sat {k}": m(sat, k) for k in ("tpot", "e2e")})
    out["ci"] = float(np.mean([abs(c["error_nccl_pct"]) for c in ci]))
    out["ci vllm-ar"] = float(np.mean([abs(c["error_pct"]) for c in ci]))
    if train == "sync+8b":  # the CI cases it was not fitted on
        rest = [c for c in ci if (c["model"], c["gpu"], c["tp"]) not in TRAIN_CI[train] + H200_TRAIN]
        out["held-out ci"] = float(np.mean([abs(c["error_nccl_pct"]) for c in rest]))
        out["held-out ci vllm-ar"] = float(np.mean([abs(c["error_pct"]) for c in rest]))
    return out


def per_model(rows: list[dict]) -> dict[str, float]:
    """Mean signed TPOT error (%) of each file's unsaturated phases: whether a model is fast or slow."""
    out = {}
    for r in rows:
        if not r["saturated"]:
            out.setdefault(r["file"].split("-1.csv")[0], []).append(r["tpot_error_pct"])
    return {k: float(np.mean(v)) for k, v in out.items()}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=ROOT.parent / "shared" / "reference" / "gpu_serving")
    p.add_argument("--train", choices=tuple(TRAIN_CI), default="sync")
    p.add_argument("--forms", nargs="*", default=[f.name for f in FORMS])
    a = p.parse_args(argv)
    if not a.root.is_dir():
        print(f"skipped: no reference measurements at {a.root}")
        return 0
    bench = bench_module()
    for form in (f for f in FORMS if f.name in a.forms):
        H200_MBU.clear()
        x = fit(bench, a.root, form, a.train)
        h200 = fit_h200(bench, a.root, form, x) if a.train == "sync+8b" and form.params else None
        priced_with(bench, form, x)
        rows, ci, _ = bench.run(a.root)
        fitted = ", ".join(f"{n} {v:.4g}" for n, v in zip(form.params, x)) or "nothing fitted"
        fitted += f"; H200 mbu {h200:.4g}" if h200 is not None else ""
        print(f"## {form.name} (train {a.train}): {fitted}")
        print("  " + ", ".join(f"{k} {v:.1f}%" for k, v in summary(rows, ci, a.train).items()))
        print("  TPOT bias: " + ", ".join(f"{k} {v:+.1f}%" for k, v in per_model(rows).items()))
        print("  CI: " + ", ".join(f"{c['model']}/{c['gpu']}/TP{c['tp']} {c['error_nccl_pct']:+.1f}% "
                                   f"(vllm-ar {c['error_pct']:+.1f}%)" for c in ci), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
