r"""A served run's iterations executed again, to tell what in serving makes its iterations slower than the
fit prices the same plans. The run's policy re-plans every logged iteration (`serving.replay.LoggedRun`, as
`simctl validate` reprices them) and each plan is executed again on a fresh engine of the run's shape (same
model, seed, slab, prompts; `executor.plans.PlanExecutor`), timed as the engine times it (`execute`: inputs,
forward, LM head, argmax), and priced by the cost model. Modes (`--modes`, each run `--rounds` times):

- `b2b`: every plan right after the previous one (no arrival gaps; only the loop's own work between plans).
- `gaps`: each plan at its logged start relative to the first (the run's idle gaps reproduced by sleeping).
- `nogc`: as b2b, the garbage collector off inside each timed call (as the profiler times them).
- `profile`: the quick grid timed in this process by the profiler's own code (`profiler.worker.Worker`),
  each shape over `--reference`'s (a profile.csv): the machine's speed now, relative to that profile.

The logged durations of the run itself are reported as `served`. With `--repeats R` (b2b) each plan's
segments also run R more times at once, with the same and with random tokens (a cache kept warm by the same
shape, the same experts); with `--variant-rounds R` sampled iterations are re-run afterwards as VARIANTS
(one factor changed each: a small slab as the profiler's, every decode row at the mean context, random
tokens, all three), interleaved in shuffled order, R rounds.

    OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=2 .venv/bin/python research/served_replay.py \
        RUN_DIR --cost PROFILE/cost_model.json --rounds 2 --modes b2b,gaps,profile \
        --reference PROFILE/profile.csv
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from simctl.engine.serve import prompt_ids, warm_up
from simctl.executor.config import ExecutorConfig
from simctl.executor.model import build_model
from simctl.executor.plans import PlanExecutor
from simctl.executor.ragged import RaggedExecutor
from simctl.serving.replay import LoggedRun
from simctl.validation.replay import _kind

BUCKETS = [0, 1, 2, 4, 8, 16, 32, 64, 256]
VARIANTS = ("served", "small_slab", "uniform_ctx", "random_tokens", "profile_like")
KEY = ["kind", "batch_size", "linear_tokens", "sampled_tokens", "num_segments", "decode_rows", "decode_kv",
       "q", "c"]


class Executing(LoggedRun):
    """The log's plans, each executed on `executor` and timed; `gaps`: at its logged start."""

    def __init__(self, iterations: pd.DataFrame, executor: PlanExecutor, cost: Any, gaps: bool,
                 repeats: int = 0, vocab: int = 0) -> None:
        super().__init__(iterations, lambda plan, start, dur: None)
        self.executor, self.cost, self.gaps = executor, cost, gaps
        self.repeats, self.vocab = repeats, vocab
        self.capture = False
        self.nogc = False  # the profiler's way: no collector pauses inside timed calls
        self.captured: list[tuple[int, list[Any]]] = []  # (row, the packed plan's segments)
        self.gen = torch.Generator().manual_seed(1)
        ragged = executor.executor
        self.segs: list[Any] = []
        inner = ragged.run

        def recording(segs: list[Any]) -> Any:
            self.segs = list(segs)
            return inner(segs)

        ragged.run = recording
        self.rows: list[dict[str, Any]] = []
        self.t0 = time.perf_counter() - float(self.starts[0])

    def run(self, plan: Any, start: float) -> float:
        end = super().run(plan, start)
        if self.gaps:
            wait = start - (time.perf_counter() - self.t0)
            if wait > 0:
                time.sleep(wait)
        if self.nogc:
            gc.disable()
        ru0 = resource.getrusage(resource.RUSAGE_SELF)
        t = time.perf_counter()
        self.executor.execute(plan)
        took = time.perf_counter() - t
        ru1 = resource.getrusage(resource.RUSAGE_SELF)
        if self.nogc:
            gc.enable()
        if self.capture and plan.layout.name == "PACKED":
            self.captured.append((len(self.rows), list(self.segs)))
        self.rows.append({"kind": _kind(plan), "decode_rows": plan.decode_rows,
                          "linear_tokens": plan.linear_tokens, "logged_s": float(self.durations[self.i - 1]),
                          "real_s": took, "predicted_s": self.cost.iteration_time(plan),
                          "pad_s": self.cost.breakdown(plan).get("decode_attention", 0.0)
                          - plan.decode_rows * self.cost._dec(plan.decode_kv / max(plan.decode_rows, 1)),
                          "decode_kv": plan.decode_kv, "minflt": ru1.ru_minflt - ru0.ru_minflt,
                          "stime_s": ru1.ru_stime - ru0.ru_stime, "utime_s": ru1.ru_utime - ru0.ru_utime,
                          **self._repeat()})
        return end

    def _repeat(self) -> dict[str, float]:
        """The plan's segments run again `repeats` times right away: with the same tokens (the profile's
        way: same experts), and with fresh random tokens each time (other experts); then the same tokens once
        more, so the slab holds the served KV again."""
        if not self.repeats:
            return {}
        from simctl.executor.ragged import Segment

        ragged = self.executor.executor
        inner = type(ragged).run
        out: dict[str, list[float]] = {"same_s": [], "rand_s": []}
        for _ in range(self.repeats):
            t = time.perf_counter()
            inner(ragged, self.segs)
            out["same_s"].append(time.perf_counter() - t)
        for _ in range(self.repeats):
            rand = [Segment(g.slot, torch.randint(0, self.vocab, (g.q,), generator=self.gen).tolist(),
                            g.cached, g.sample) for g in self.segs]
            t = time.perf_counter()
            inner(ragged, rand)
            out["rand_s"].append(time.perf_counter() - t)
        inner(ragged, self.segs)
        return {k: float(np.median(v)) for k, v in out.items()}

    def release(self, finished: list[Any]) -> None:
        self.executor.release(finished)


def execute_run(run: Path, cost: Any, gaps: bool, repeats: int = 0, variants: tuple[int, int] = (0, 0),
                nogc: bool = False) -> pd.DataFrame:
    from simctl.catalogue.models import get_model
    from simctl.serving.inbox import Inbox
    from simctl.serving.loop import Replica
    from simctl.validation.twin import twin_inputs

    summary = json.loads((run / "summary.json").read_text())
    iterations = pd.read_parquet(run / "iterations.parquet")
    spec = get_model(summary["model"])
    model = build_model(spec, "cpu", summary["dtype"], summary["seed"])
    ragged = RaggedExecutor(model, summary["kv_slots"], summary["kv_slot_tokens"],
                            ExecutorConfig(summary.get("attention", "auto")))
    reqs, policy = twin_inputs(summary)
    prompts = {r.id: prompt_ids(r.id, r.prompt_tokens, spec.vocab_size, summary["seed"]) for r in reqs}
    warm_up(ragged, spec.vocab_size, seed=summary["seed"])
    from simctl.serving.handoff import arrivals

    seqs = arrivals(reqs).entering
    log = Executing(iterations, PlanExecutor(ragged, prompts), cost, gaps, repeats,
                    spec.vocab_size)
    inbox = Inbox(seqs)
    log.watch(policy, inbox)
    log.capture = bool(variants[0])
    log.nogc = nogc
    with torch.inference_mode():
        log.drive(Replica(policy, log, log, inbox).serve())
    frame = pd.DataFrame(log.rows)
    if log.capture:
        v = time_variants(log.captured, model, ragged, spec.vocab_size, *variants)
        frame = frame.join(v.set_index("row"))
    return frame


def by_bucket(f: pd.DataFrame, col: str) -> pd.Series:
    d = f[f["kind"] == "decode"]
    r = d[col] / d["predicted_s"]
    return r.groupby(pd.cut(d["decode_rows"], BUCKETS), observed=True).median()


def report(frames: dict[str, list[pd.DataFrame]]) -> None:
    for mode, fs in frames.items():
        f = pd.concat(fs, ignore_index=True)
        col = "logged_s" if mode == "served" else "real_s"
        ratio = f[col].sum() / f["predicted_s"].sum()
        kinds = {k: round(float((g[col] / g["predicted_s"]).median()), 3) for k, g in f.groupby("kind")}
        if "minflt" in f:
            print(f"  {mode}: minor faults per iteration {f['minflt'].mean():.1f}, system time share "
                  f"{f['stime_s'].sum() / (f['stime_s'].sum() + f['utime_s'].sum()):.3f}")
        print(f"{mode}: n={len(f)} total {f[col].sum():.3f} s / priced {f['predicted_s'].sum():.3f} s "
              f"= {ratio:.3f}; median per kind {kinds}")
        print("  decode rows:", {str(k): round(float(v), 3) for k, v in by_bucket(f, col).items()})


def main() -> None:
    from simctl.costs.fitted import Fitted

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=Path, help="a real run's folder (summary.json, iterations.parquet)")
    p.add_argument("--cost", required=True)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--modes", default="b2b,gaps")
    p.add_argument("--repeats", type=int, default=0,
                   help="b2b: run each plan's segments again this many times (same tokens, random tokens)")
    p.add_argument("--variant-rounds", type=int, default=0,
                   help="b2b: time sampled iterations as each variant (VARIANTS) this many rounds")
    p.add_argument("--variant-sample", type=int, default=120)
    p.add_argument("--reference", type=Path, help="mode profile: the profile.csv compared with")
    p.add_argument("--save", type=Path, help="write every round's iterations here (parquet)")
    args = p.parse_args()
    cost = Fitted.load(args.cost)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "2")))
    frames: dict[str, list[pd.DataFrame]] = {"served": [], **{m: [] for m in args.modes.split(",")
                                                              if m != "profile"}}
    for k in range(args.rounds):
        for mode in args.modes.split(","):
            if mode == "profile":
                print(f"round {k}: in-process quick profile / reference:", profile_in_process(args.reference),
                      flush=True)
                continue
            f = execute_run(args.run, cost, gaps=mode == "gaps", repeats=args.repeats if mode == "b2b" else 0,
                            variants=(args.variant_rounds, args.variant_sample) if mode == "b2b" else (0, 0),
                            nogc=mode == "nogc")
            frames[mode].append(f.assign(round=k, mode=mode))
            if k == 0 and not frames["served"]:
                frames["served"].append(f.assign(round=k, mode="served"))
    extra_reports(frames, args)
    if args.save:
        pd.concat([f for fs in frames.values() for f in fs]).to_parquet(args.save)
    print("load", [round(x, 2) for x in os.getloadavg()])


def extra_reports(frames: dict[str, list[pd.DataFrame]], args: argparse.Namespace) -> None:
    report(frames)
    if args.repeats:
        f = pd.concat(frames["b2b"], ignore_index=True)
        for col in ("same_s", "rand_s"):
            frames[col] = [f.assign(real_s=f[col])]
        report({k: frames[k] for k in ("same_s", "rand_s")})
    if args.variant_rounds:
        f = pd.concat(frames["b2b"], ignore_index=True).dropna(subset=["served"])
        report({v: [f.assign(real_s=f[v])] for v in VARIANTS})
        for v in VARIANTS[1:]:
            r = f[v] / f["served"]
            print(f"{v} / served: median {r.median():.3f}, by decode rows",
                  r[f.kind == "decode"].groupby(pd.cut(f.decode_rows[f.kind == "decode"], BUCKETS),
                                                observed=True).median().round(3).to_dict())



def _variant(segs: list[Any], name: str, gen: torch.Generator, vocab: int) -> tuple[list[Any], bool]:
    """The segments of variant `name` of a served iteration, and whether they run on the small slab."""
    from simctl.executor.ragged import Segment

    small = name in ("small_slab", "profile_like")
    uniform = name in ("uniform_ctx", "profile_like")
    rand = name in ("random_tokens", "profile_like")
    dec = [g.cached for g in segs if g.q == 1]
    mean_c = round(sum(dec) / len(dec)) if dec else 0
    order = {g.slot: i for i, g in enumerate(sorted(segs, key=lambda g: g.slot))}
    out = []
    for g in segs:
        toks = torch.randint(0, vocab, (g.q,), generator=gen).tolist() if rand else g.tokens
        c = mean_c if uniform and g.q == 1 else g.cached
        out.append(Segment(order[g.slot] if small else g.slot, toks, c, g.sample))
    return out, small


def time_variants(captured: list[tuple[int, list[Any]]], model: Any, big: RaggedExecutor, vocab: int,
                  rounds: int, sample: int) -> pd.DataFrame:
    """Each sampled captured iteration run as every variant, `rounds` times in shuffled order after one
    untimed call of each; the median time per variant."""
    rng = np.random.default_rng(0)
    gen = torch.Generator().manual_seed(2)
    pick = captured if len(captured) <= sample else [captured[i] for i in
                                                     np.linspace(0, len(captured) - 1, sample).astype(int)]
    rows = []
    with torch.inference_mode():
        for row, segs in pick:
            runs = {v: _variant(segs, v, gen, vocab) for v in VARIANTS}
            need = max(g.cached + g.q for g in segs) + 1
            small = RaggedExecutor(model, len(segs) + 3, need, big.config)
            times: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for k in range(rounds + 1):
                for v in rng.permutation(VARIANTS):
                    vsegs, on_small = runs[v]
                    ex = small if on_small else big
                    t = time.perf_counter()
                    ex.run(vsegs)
                    if k:
                        times[v].append(time.perf_counter() - t)
            rows.append({"row": row, **{v: float(np.median(ts)) for v, ts in times.items()}})
    return pd.DataFrame(rows)


def profile_in_process(reference: Path, model: str = "tiny-moe") -> str:
    """The quick grid timed by the profiler's own worker code (`profiler.worker.Worker`) in this process,
    each shape's time over the reference profile's: the median and quartiles of the ratio."""
    import io

    from simctl.profiler.worker import Worker

    out = io.StringIO()
    Worker(model, "cpu", "float32", torch.get_num_threads(), "quick", 0, out).run()
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    mine = pd.DataFrame([r["row"] for r in rows if r["event"] == "row"])
    ref = pd.read_csv(reference)
    m = ref.merge(mine, on=KEY, suffixes=("_ref", "_now"))
    r = m["time_s_now"] / m["time_s_ref"]
    return f"median {r.median():.3f} (q1 {r.quantile(0.25):.3f}, q3 {r.quantile(0.75):.3f}, {len(r)} shapes)"


if __name__ == "__main__":
    main()
