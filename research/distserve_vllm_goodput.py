"""Why does colocated vLLM TP1 reach ~1.7 req/s/GPU of goodput in the DistServe chatbot study
(bench/papers/distserve.py) when the paper's vLLM baseline reaches ~1.1 (its Table 2)? Which of the study's
candidates, a late-2023 vLLM slower than the roofline prices or other prompt lengths, moves it there, and how
far must each be pushed?

Method: the study's own goodput search (its `run_config`, `goodput` and `sharegpt_under`: vLLM's v0 policy,
eager, llama-2-13b on one A100-80GB, NCCL's all-reduce, TTFT <= 0.25 s and TPOT <= 0.1 s for 90% of
requests), varying one thing at a time:
- `step`: the host's time per step (`step_overhead_ms`, replacing the eager default's 40 layers x 18.1 us;
  the eager launch floor and the per-request term stay), paid by prefill and decode steps alike;
- `prefill`: every step that prefills priced k times the roofline (a wrapper of the study's own cost model,
  below). vLLM v0's steps are all-prefill or all-decode, so this scales the prefills and nothing else;
- `prompt`: the trace's prompt tokens times s (outputs kept), and only its prompts under 512-2,048 kept;
- `measured`: prefill steps with the linears priced as Vidur's A100 profile of this layer shape measured them,
  with the elementwise kernels the roofline leaves out (the wrapper `MeasuredLinears`).
Each goodput with the SLO term that bound it (the study's `binding`) and the P90 TTFT of the same run at
0.1 req/s (`unloaded_ttft_p90`: the prefills alone); where a sweep crosses 1.1 req/s/GPU, the setting is
bisected between the grid's two neighbours.

Usage: python research/distserve_vllm_goodput.py [--requests 1000]
Writes research/results/distserve_vllm_goodput.md.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import numpy as np
import pandas as pd

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.costs.base import CostModel
from simctl.costs.loader import load_cost
from simctl.costs.roofline import Roofline
from simctl.policies.plan import BatchPlan, hybrid
from simctl.policies.seq import Seq
from simctl.profiler.operator_profiles import LAYER_OPERATORS, load_operator_profile
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig

ROOT = Path(__file__).resolve().parents[1]
PROFILES = ROOT.parent / "shared" / "reference" / "gpu_profiles"  # Vidur's published operator profiles
RESULTS = ROOT / "research" / "results" / "distserve_vllm_goodput.md"
STEP_MS = (0.0, 5.0, 10.0, 20.0, 30.0, 40.0, 60.0)
PREFILL_K = (1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0)
PROMPT_SCALE = (0.5, 0.75, 1.0, 1.25, 1.5)
CAPS = (512, 1024, 1536, 2048)  # prompts kept under each; also the single prompts the measured kernels price
# Vidur's per-layer operators that the roofline's `linear` term stands for, or leaves out (elementwise)
MEASURED = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
            "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def study() -> ModuleType:
    """bench/papers/distserve.py as a module (it imports its sibling paper_results, hence the path)."""
    sys.path.insert(0, str(ROOT / "bench" / "papers"))
    spec = importlib.util.spec_from_file_location("distserve", ROOT / "bench" / "papers" / "distserve.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["distserve"] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class PrefillScaled(CostModel):
    """`base` with every step that prefills priced `k` times (its host terms and launch floor too)."""

    base: CostModel
    k: float

    def _f(self, plan: BatchPlan) -> float:
        return self.k if plan.prefill_tokens else 1.0

    def iteration_time(self, plan: BatchPlan) -> float:
        return self._f(plan) * self.base.iteration_time(plan)

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        return self._f(plan) * self.base.stretch_times(plan, k)


@dataclass(frozen=True)
class MeasuredLinears(CostModel):
    """`base` (the roofline) with a prefill step's linear layers priced as measured on the A100 for this
    layer shape: the linears plus the norms, rotary embedding, activation and residual adds beside them,
    which the roofline leaves out (`seconds` per layer at `tokens`, interpolated in the step's tokens)."""

    base: Roofline
    tokens: np.ndarray
    seconds: np.ndarray

    def _extra(self, plan: BatchPlan) -> float:
        if not plan.prefill_tokens:
            return 0.0
        layer = float(np.interp(plan.linear_tokens, self.tokens, self.seconds))
        return self.base.model.num_layers * layer - self.base.breakdown(plan)["linear"]

    def iteration_time(self, plan: BatchPlan) -> float:
        return self.base.iteration_time(plan) + self._extra(plan)

    def stretch_times(self, plan: BatchPlan, k: int) -> np.ndarray:
        return self.base.stretch_times(plan, k) + self._extra(plan)


def bisect(goodput: Callable[[float], float], lo: float, hi: float, target: float, steps: int
           ) -> tuple[float, float]:
    """(the highest setting found meeting `target`, the lowest missing it) from lo (meets), hi (misses)."""
    for _ in range(steps):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if goodput(mid) >= target else (lo, mid)
    return lo, hi


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=6, help="bisection steps towards the paper's goodput")
    args = ap.parse_args()
    d = study()
    target, n = d.PAPER_VLLM_PER_GPU, args.requests
    started = time.process_time()
    rows: list[tuple[str, float, float, str, float, float]] = []  # sweep, setting, goodput/GPU, binds,
    with tempfile.TemporaryDirectory() as tmp:                     # mean prompt, unloaded P90 TTFT
        base_df = d.sharegpt_under()

        def trace(df: pd.DataFrame) -> str:
            path = Path(tmp) / f"{len(list(Path(tmp).iterdir()))}.csv"
            df.to_csv(path, index=False)
            return str(path)

        base = trace(base_df)
        eager = d.run_config(base, "eager", n)
        # the study's own roofline (simctl's loader with the study's options), wrapped
        roofline = load_cost(None, get_model(eager.model), get_gpu(eager.gpu), 1, eager.roofline_options).cost
        # Vidur's profile of the model's layer shape on the GPU
        prof = load_operator_profile(PROFILES, roofline.model, roofline.gpu.name, 1)
        measured = MeasuredLinears(roofline, prof.tokens, sum(prof.operators[o] * LAYER_OPERATORS[o]
                                                              for o in MEASURED))
        plans = [hybrid([], [Seq(0, 0.0, t, 1)], [t]) for t in CAPS]
        steps = [(t, roofline.iteration_time(p), measured.iteration_time(p)) for t, p in zip(CAPS, plans)]

        def prompts(df: pd.DataFrame) -> tuple[RunConfig, pd.DataFrame]:
            return d.run_config(trace(df), "eager", n), df

        def scaled(s: float) -> pd.DataFrame:  # 2,047 x 1.5 + 1,024 outputs stays within the 4,096 context
            return base_df.assign(num_prefill_tokens=(base_df["num_prefill_tokens"] * s).round().clip(1))

        # each sweep: its settings, and the run (with its trace) of one setting
        Make = Callable[[float], tuple[RunConfig, pd.DataFrame]]
        sweeps: dict[str, tuple[tuple[float, ...], Make]] = {
            "step ms": (STEP_MS, lambda ms: (d.run_config(base, "eager", n, step_overhead_ms=ms), base_df)),
            "prefill k": (PREFILL_K, lambda k: (d.run_config(base, None, n, cost=PrefillScaled(roofline, k)),
                                                base_df)),
            "prompt x": (PROMPT_SCALE, lambda s: prompts(scaled(s))),
            "prompts under": (CAPS, lambda cap: prompts(base_df[base_df["num_prefill_tokens"] < cap])),
            "prefill linears as measured": ((1,), lambda _: (d.run_config(base, None, n, cost=measured),
                                                             base_df)),
        }

        def add(sweep: str, x: float, cfg: RunConfig, df: pd.DataFrame) -> float:
            g = d.goodput(cfg, ClusterConfig())
            term, over = d.binding(g)
            binds = f"{term} (P90/limit " + ", ".join(f"{k} {v:.2f}" for k, v in over.items()) + ")"
            rows.append((sweep, x, g.per_gpu, binds, float(df["num_prefill_tokens"].mean()),
                         d.unloaded_ttft_p90(cfg)))
            print(rows[-1], flush=True)
            return g.per_gpu

        add("study (eager defaults)", 0.0, eager, base_df)
        for sweep, (xs, make) in sweeps.items():
            for x in xs:
                add(sweep, x, *make(x))
        found = {}
        for sweep in ("step ms", "prefill k", "prompt x"):  # bisect between the grid's two neighbours
            xs, make = sweeps[sweep]
            ys = [g for s, _, g, *_ in rows if s == sweep]
            i = next(i for i, y in enumerate(ys) if y < target)
            found[sweep] = bisect(lambda x, sw=sweep, mk=make: add(sw + " (bisection)", x, *mk(x)),
                                  xs[i - 1], xs[i], target, args.steps)
    cpu = time.process_time() - started
    command = f"python research/distserve_vllm_goodput.py --requests {n}"
    lines = [f"# vLLM TP1 goodput, DistServe chatbot study, one input at a time (2026-11-28; `{command}`)",
             "",
             ("Made by `research/distserve_vllm_goodput.py` (its docstring: the question and the method). "
              f"{n} requests a probe; {len(rows)} goodput searches, each with a run at {d.UNLOADED_QPS} "
              f"req/s (unloaded), in {cpu:.0f} s of CPU time (`time.process_time`)."), "",
             ("| sweep | setting | mean prompt tokens | goodput req/s/GPU | binds (lowest probe above) "
              f"| P90 TTFT at {d.UNLOADED_QPS} req/s, s |"),
             "|---|---:|---:|---:|---|---:|"]
    lines += [f"| {s} | {x:.4g} | {m:.0f} | {g:.3f} | {b} | {u:.3f} |" for s, x, g, b, m, u in rows]
    lines += ["", (f"Where each sweep crosses the paper's ~{target} req/s/GPU ({args.steps} bisection steps "
                   "between the grid's neighbours: the last setting at or above it, the first below):"), ""]
    lines += [f"- {sweep}: {lo:.4g} .. {hi:.4g}" for sweep, (lo, hi) in found.items()]
    lines += ["- prompts under: cutting the prompts shorter only raises the goodput (the table)", "",
              ("One prompt's prefill step (eager), the roofline's against the same step with its linears "
               f"priced as Vidur's A100 profile of this layer shape (`{prof.model_dir}`, TP1): the linears "
               "plus the norms, rotary embedding, activation and residual adds (the `prefill linears as "
               "measured` row prices every prefill so):"), "",
              "| prompt tokens | roofline ms | measured linears ms | ratio |", "|---:|---:|---:|---:|"]
    lines += [f"| {t} | {r * 1e3:.1f} | {m * 1e3:.1f} | {m / r:.3f} |" for t, r, m in steps]
    (g0, u0), ratios = rows[0][2:6:3], [m / r for _, r, m in steps]
    g_measured = next(g for s, _, g, *_ in rows if s == "prefill linears as measured")
    mean = next(m for s, x, _, _, m, _ in rows if s.startswith("prompt x") and x == found["prompt x"][0])
    (k0, k1), (p0, p1), (ms0, ms1) = found["prefill k"], found["prompt x"], found["step ms"]
    limit, bound = d.paper_slo().per_request["ttft"], rows[0][3].split()[0].upper()
    q90 = base_df["num_prefill_tokens"].quantile(0.9)
    lines += ["", "## Reading", "", (
        f"The study's goodput, {g0:.3f} req/s/GPU, sits on a cliff: unloaded, its P90 TTFT is already "
        f"{u0:.3f} s of the {limit:g} s limit (the longest prompts' own prefills), and {bound} binds it. "
        f"~{target} req/s/GPU takes only prefill steps priced {k0:.3f}-{k1:.3f}x, or prompts "
        f"{p0:.3f}-{p1:.3f}x as long (mean {mean:.0f} tokens), or {ms0:.4g}-{ms1:.4g} ms of host time a "
        f"step (the eager default: {roofline.overhead_s * 1e3:.2f} ms). The brackets hold to the search's "
        "resolution; near the cliff neighbouring settings' goodputs are not always in order (the bisection "
        "rows). The A100's measured kernels of this layer shape price a prefill step "
        f"{min(ratios):.2f}-{max(ratios):.2f}x the roofline's ({ratios[-2]:.2f}, {ratios[-1]:.2f}x at 1,536 "
        f"and 2,048 tokens, around the trace's P90 prompt, {q90:.0f}) and bring the goodput to "
        f"{g_measured:.3f}, {(g0 - g_measured) / (g0 - target):.0%} of the way. The rest is what vLLM 0.2's "
        "own prefill (its attention kernel, its Python per step) or the paper's filtered lengths would add; "
        "neither is in the material. For scale, not vLLM: simctl's own eager executor on an H100 was fitted "
        "9.4 ms a step beside its 27.6 ms launch floor, and its GPU-bound prompts took 1.51-1.52x Vidur's "
        "operator sum (bench/results/gpu_h100.md).")]
    text = "\n".join(lines) + "\n"
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(text, encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
