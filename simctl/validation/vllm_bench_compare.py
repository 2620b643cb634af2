"""`simctl validate --from-vllm-bench FILE`: a user's own `vllm bench serve` measurement beside simctl's
prediction of it, under vLLM's metric names.

The file's successful requests (`traces.vllm_bench`) are simulated as a trace (`sim.run.run` with the file
as `--trace`: their lengths, arriving when the benchmark sent them) under the chosen policy and cost model.
The measured side is recomputed from the file's per-request lists with vLLM's definitions
(`results.vllm_bench.Stats.of`, so it can be checked by hand; it agrees with the file's own aggregates, and
any that do not are named in `warnings`); the predicted side is the run's `vllm_bench` block. Errors are
(predicted - measured) / measured. Goodput is compared when `--goodput` gives the limits (the file keeps
vLLM's value but not the limits it used); without them, the file's value is shown alone. """

from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from simctl.common.errors import InputError
from simctl.results.output import json_text, write_files
from simctl.results.validation_report import fmt_err, pct_error
from simctl.results.vllm_bench import ITL_PERCENTILES, KEYS, GoodputLimits, Stats, block, with_goodput
from simctl.sim.run import RunConfig, run
from simctl.traces.vllm_bench import VLLMBench, read_vllm_bench
from simctl.traces.workload import Workload

FILES = ("vllm_bench_comparison.json", "vllm_bench_comparison.md")
DEFAULT_POLICY = "vllm-v1"
AGREE_REL = 1e-6  # a file's aggregate and its lists' recomputation agree to rounding


@dataclass(frozen=True)
class Comparison:
    bench: VLLMBench
    rows: list[dict[str, Any]]  # metric, measured, predicted, error_pct
    assumptions: list[str]
    warnings: list[str]
    goodput: GoodputLimits | None
    prediction: dict[str, Any]  # the simulated run's summary

    def record(self) -> dict[str, Any]:
        b = self.bench
        return {
            "file": str(b.path), "model_id": b.model_id, "sent": b.sent, "completed": len(b),
            "failed": b.failed, "duration_s": b.duration_s, "send_times_measured": b.send_times_measured,
            "traffic": {k: "inf" if isinstance(v, float) and math.isinf(v) else v  # JSON has no Infinity
                        for k, v in asdict(b.traffic).items()},
            "prediction": {k: self.prediction.get(k) for k in ("policy", "model", "gpu", "tp", "cost_model")},
            "goodput": self.goodput.describe() if self.goodput else None,
            "metrics": self.rows, "assumptions": self.assumptions, "itl_percentiles": ITL_PERCENTILES,
            "warnings": self.warnings, "prediction_summary": self.prediction,
        }


def measured(bench: VLLMBench, goodput: GoodputLimits | None) -> dict[str, float | None]:
    """vLLM's metrics of the file's successful requests, from its per-request lists."""
    out, tokens = bench.output_tokens, bench.prompt_tokens
    multi = out > 1
    tpot = (bench.latency_s[multi] - bench.ttft_s[multi]) / (out[multi] - 1)
    stats = {"ttft": Stats.of(bench.ttft_s), "tpot": Stats.of(tpot), "itl": Stats.of(bench.itl_s),
             "e2el": Stats.of(bench.latency_s)}  # simctl.results.vllm_bench.METRICS
    values = block(stats, len(bench), int(out.sum()), int(out.sum() + tokens.sum()), bench.duration_s)
    if goodput is not None:
        values["request_goodput"] = goodput.request_goodput(_requests_table(bench), bench.duration_s)
    return values


def _requests_table(bench: VLLMBench) -> pd.DataFrame:
    """The file's requests as a requests table (serving.records.request_frame's columns an SLO reads), each
    timed from its own send."""
    return pd.DataFrame({"arrival_s": np.zeros(len(bench)), "first_token_s": bench.ttft_s,
                         "completion_s": bench.latency_s, "output_tokens": bench.output_tokens,
                         "max_tbt_s": bench.max_itl_s})


def compare(path: str | Path, model: str, gpu: str, policy: str = DEFAULT_POLICY, cost: str | None = None,
            tp: int = 1, goodput: GoodputLimits | None = None) -> Comparison:
    """The bench result at `path` beside its prediction by `policy` on `model` / `gpu` x `tp` priced by `cost`
    (simctl.sim.run.cost_model's choice when None), goodput with `goodput`'s limits."""
    if Path(path).suffix.lower() != ".json":  # it is simulated as a trace file, which its extension names
        raise InputError(f"--from-vllm-bench {path}: expected a .json file, as `vllm bench serve "
                         "--save-result` writes")
    bench = read_vllm_bench(path)
    workload = Workload(trace=str(path), qps=None, num_requests=len(bench),
                        concurrency=bench.traffic.max_concurrency)  # its client bound: closed loop
    sim = run(RunConfig(policy=policy, workload=workload,
                        model=model, gpu=gpu, tp=tp, cost=cost))
    predicted = with_goodput(sim.summary, sim.result.requests, goodput)["vllm_bench"]
    real = measured(bench, goodput)
    keys = list(KEYS)
    file_goodput = bench.reported.get("request_goodput")
    if goodput is not None or file_goodput is not None:
        keys.append("request_goodput")
        real.setdefault("request_goodput", file_goodput)
    rows = [{"metric": k, "measured": real[k], "predicted": predicted.get(k),
             "error_pct": pct_error(predicted.get(k), real[k])} for k in keys]
    warnings = [*_other_model(bench.model_id, model), *sim.summary.get("warnings", []),
                *_disagreements(bench, real, goodput)]
    if not sim.summary["sustainable"]:
        warnings.append(f"the prediction is overloaded: {sim.summary['unsustainable_reason']}")
    if sim.summary["completed"] < len(bench):
        warnings.append(f"the prediction completed {sim.summary['completed']} of {len(bench)} requests (it "
                        "gave up)")
    if goodput is None and file_goodput is not None:
        warnings.append("the file's request_goodput is shown alone: give --goodput with the limits the bench "
                        "ran with to predict it")
    settings = f"{policy} with its default settings (the file does not record the server's scheduler setup)"
    assumptions = [*bench.assumptions(), settings]
    return Comparison(bench, rows, assumptions, warnings, goodput, sim.summary)


def _other_model(model_id: str | None, model: str) -> list[str]:
    """A warning when the file's `model_id` (a Hugging Face id or path, e.g. meta-llama/Llama-2-7b-hf) does
    not name --model (a catalogue name, a config.json or its folder, e.g. llama-2-7b): names compared by
    their letters and digits, the one within the other, so "mistral-7b" matches
    "mistralai/Mistral-7B-Instruct-v0.2"."""
    from simctl.catalogue.model_config import config_file, is_config_path

    def key(name: str) -> str:
        return re.sub(r"[^a-z0-9]", "", name.lower().rstrip("/").rsplit("/", 1)[-1])

    if not model_id:
        return []
    ours = config_file(model).parent.name if is_config_path(model) else model
    theirs, mine = key(model_id), key(ours)
    if mine and (mine in theirs or theirs in mine):
        return []
    return [(f"the file's model_id {model_id!r} does not name --model {model}: the prediction prices "
             f"{ours}'s shape, not necessarily the model the bench served")]


def _disagreements(bench: VLLMBench, real: dict[str, float | None], goodput: GoodputLimits | None
                   ) -> list[str]:
    """The file's own aggregates that its per-request lists do not reproduce."""
    out = []
    for key, value in bench.reported.items():
        mine = real.get(key)
        if mine is None or (key == "request_goodput" and goodput is None):  # not recomputed: shown as is
            continue
        if not math.isclose(mine, value, rel_tol=AGREE_REL, abs_tol=1e-9):
            why = " (measured with other --goodput limits?)" if key == "request_goodput" else ""
            out.append(f"the file's {key} is {value:.6g}, its per-request lists give {mine:.6g}{why}")
    return out


def fmt_value(v: float | None) -> str:
    if v is None:
        return "n/a"
    return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"  # 4 significant digits, no exponent


def markdown(c: Comparison) -> str:
    b, p = c.bench, c.prediction
    lines = [f"# vLLM bench vs simctl: {b.path.name}", "",
             f"Measured: {len(b)} of {b.sent} requests completed ({b.failed} failed) in {b.duration_s:.3f} s"
             + (f", model {b.model_id}" if b.model_id else "") + ".",
             f"Predicted: {p['policy']} on {p['model']} / {p['gpu']} x{p['tp']}, {p['cost_model']}"
             + (f"; goodput limits {c.goodput.describe()} ms" if c.goodput else "") + ".", "",
             "| metric | measured | predicted | error |", "|---|---:|---:|---:|"]
    lines += [f"| {r['metric']} | {fmt_value(r['measured'])} | {fmt_value(r['predicted'])} | "
              f"{fmt_err(r['error_pct'])} |" for r in c.rows]
    lines += ["", "Assumed:", *(f"- {a}" for a in c.assumptions),
              f"- predicted {ITL_PERCENTILES}"]
    if c.warnings:
        lines += ["", "Warnings:", *(f"- {w}" for w in c.warnings)]
    return "\n".join(lines) + "\n"


def write_comparison(c: Comparison, out: Path) -> None:
    """vllm_bench_comparison.json and .md in `out`, both or neither."""
    text, md = json_text(c.record()), markdown(c)
    write_files(out, {FILES[0]: lambda p: p.write_text(text, encoding="utf-8"),
                      FILES[1]: lambda p: p.write_text(md, encoding="utf-8")}, "the comparison")
