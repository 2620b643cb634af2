"""The vllm-v1 twin on the roofline against real vLLM serving on GPUs (simctl issue 39), no GPU needed.

    python bench/gpu_serving.py [--root ../shared/reference/gpu_serving] [--out bench/results/gpu_serving]

Reads ../shared/reference/gpu_serving/ (its README says what each file is: vLLM 0.11 on an H100, per-request
server-side times of guidellm "sweep" phases; and vLLM's CI latency benchmark on H100, H200 and A100) and
skips cleanly when it is absent. Each file is served by `vllm-v1` with the settings its README gives
(`CASES`) on the roofline of its GPU, model and TP degree, its KV cache sized as vLLM sizes it
(`costs/kv_capacity.py`; the sizes vLLM reported are compared too), one phase at a time, each as guidellm
sent it:
`synchronous` by one closed-loop client (the next request sent when the last completed), every other phase
(`throughput`, `constant@R`) open loop at the server arrival times measured (relative to the phase's first).
A phase is simulated from an empty engine, so the first request of a shared-prefix phase misses the cache
the real server kept from the phase before (one request of 40: P50s barely move).

Per phase: P50 TTFT, TPOT ((E2E - TTFT) / (output - 1), per request) and E2E, measured and predicted, and the
error (predicted / measured - 1). A phase is *saturated* when its requests queue by construction or by load:
`throughput` (all sent at once), or a measured P50 TTFT over `SATURATED_TTFT` times the file's synchronous
one. MAPE per metric over the phases that are not saturated (target 8%) and over those that are (20%).
vLLM's CI latency cases (8 requests of 32 prompt and 128 output tokens sent at once to an offline `LLM`; the
batch's latency: the last completion) are predicted the same way (target 8%), with the roofline's all-reduces
(vLLM's, costs/allreduce.py) and also with NCCL's ring throughout (`--allreduce nccl`).

Writes OUT.md and OUT.json (the rows, for comparing two versions of the model).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import ModelSpec, get_model
from simctl.costs.kv_capacity import KVSizing, VLLMProfile, kv_capacity_tokens, vllm_num_blocks
from simctl.costs.roofline import Roofline
from simctl.policies.registry import make_policy, policy_class
from simctl.sim.simulate import simulate
from simctl.traces.request import Request

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT.parent / "shared" / "reference" / "gpu_serving"
OUT = ROOT / "bench" / "results" / "gpu_serving"
METRICS = ("ttft", "tpot", "e2e")
TARGETS = {False: 8.0, True: 20.0}  # MAPE (%) over phases not saturated / saturated
CI_TARGET = 8.0
SATURATED_TTFT = 2.0  # a phase whose P50 TTFT is over twice its file's synchronous one has queued
SYNCHRONOUS, THROUGHPUT = "synchronous", "throughput"

# CodeLlama-34B-Instruct's shape, as the README gives it (Llama layout; not in simctl's catalogue)
CODELLAMA_34B = ModelSpec("codellama-34b", 48, 8192, 64, 8, 128, 22016, 32000, 16384)


@dataclass(frozen=True)
class Case:
    """A file's deployment as its README gives it (vLLM v1, chunked prefill and prefix caching, block 16)."""

    file: str
    model: ModelSpec
    max_num_batched_tokens: int
    max_num_seqs: int
    max_model_len: int
    gpu: str = "h100"
    tp: int = 1

    def profile(self) -> VLLMProfile:
        return VLLMProfile(self.max_num_batched_tokens, 16)

    def kv_tokens(self) -> int:
        """The twin's KV cache as vLLM sizes it (costs/kv_capacity.py: all blocks but the null one)."""
        return kv_capacity_tokens(self.model, get_gpu(self.gpu), self.tp, profile=self.profile())

    def kv_reported(self) -> int:
        """The KV size vLLM's log reports for this deployment, predicted: its blocks x the block size."""
        return 16 * vllm_num_blocks(self.model, get_gpu(self.gpu), self.tp, 2, KVSizing(), self.profile())

    def policy_options(self) -> dict[str, int]:
        return {"max_num_batched_tokens": self.max_num_batched_tokens, "max_batch_size": self.max_num_seqs,
                "enable_prefix_caching": 1, "block_size": 16}


CASES = (
    Case("jan20-codellama-prefill-1.csv", CODELLAMA_34B, 64, 32, 8192),
    Case("jan20-prefill-llama7b-tp1-1.csv", CODELLAMA_34B, 4096, 256, 4096),  # CodeLlama despite the name
    Case("jan20-codellama-train-1.csv", CODELLAMA_34B, 4096, 256, 8192),
    Case("jan21-llama7b-train-1.csv", get_model("llama-2-7b"), 4096, 256, 4096),
)


def cost_model(model: ModelSpec | str, gpu: str, tp: int, allreduce: str = "vllm") -> Roofline:
    """What every case is priced with: the roofline of its GPU, model and TP degree, as simctl defaults it
    (its all-reduces as vLLM runs them unless `allreduce` is "nccl": costs/allreduce.py)."""
    return Roofline(model, gpu, tp, allreduce=allreduce)


def p50s(ttft: np.ndarray, e2e: np.ndarray, output: np.ndarray) -> dict[str, float]:
    """P50 TTFT, TPOT (requests of more than one output token) and E2E."""
    multi = output > 1
    tpot = (e2e[multi] - ttft[multi]) / (output[multi] - 1)
    return {"ttft": float(np.median(ttft)), "tpot": float(np.median(tpot)) if multi.any() else float("nan"),
            "e2e": float(np.median(e2e))}


def sent(phase: str, rows: pd.DataFrame) -> tuple[list[Request], int | None]:
    """The phase's requests, arriving as measured from its first, and its closed-loop client count (1 for
    `synchronous`; None: open loop)."""
    t0 = float(rows["arrived_at"].min())
    requests = [Request(i, float(r.arrived_at) - t0, int(r.num_prefill_tokens), int(r.num_decode_tokens),
                        prefix_group=int(r.prefix_group), prefix_tokens=int(r.prefix_tokens))
                for i, r in enumerate(rows.itertuples())]
    return requests, (1 if phase == SYNCHRONOUS else None)


def predicted(case: Case, phase: str, rows: pd.DataFrame) -> dict[str, float]:
    """The twin's P50s of one phase."""
    cost = cost_model(case.model, case.gpu, case.tp)
    policy = make_policy("vllm-v1", case.kv_tokens(), case.max_model_len, case.policy_options(), case.gpu)
    requests, concurrency = sent(phase, rows)
    q = simulate(requests, policy, cost, concurrency=concurrency).request_columns
    if (q["completion_s"] < 0).any():
        raise RuntimeError(f"{case.file} {phase}: the twin did not complete every request")
    return p50s(q["first_token_s"] - q["arrival_s"], q["completion_s"] - q["arrival_s"], q["output_tokens"])


def measured(rows: pd.DataFrame) -> dict[str, float]:
    return p50s(rows["measured_ttft_s"].to_numpy(), rows["measured_e2e_s"].to_numpy(),
                rows["num_decode_tokens"].to_numpy())


def phase_rows(case: Case, frame: pd.DataFrame) -> list[dict]:
    """One row per phase (in the order sent): measured and predicted P50s, errors (%), saturated or not."""
    phases = list(dict.fromkeys(frame["phase"]))
    real = {p: measured(frame[frame["phase"] == p]) for p in phases}
    sync = real.get(SYNCHRONOUS, {}).get("ttft")
    out = []
    for p in phases:
        sim = predicted(case, p, frame[frame["phase"] == p])
        queued = sync is not None and real[p]["ttft"] > SATURATED_TTFT * sync
        row = {"file": case.file, "phase": p, "requests": int((frame["phase"] == p).sum()),
               "saturated": p == THROUGHPUT or queued}
        for m in METRICS:
            row[f"{m}_measured"], row[f"{m}_predicted"] = real[p][m], sim[m]
            row[f"{m}_error_pct"] = 100.0 * (sim[m] / real[p][m] - 1.0)
        out.append(row)
    return out


def mape(rows: list[dict]) -> dict[str, dict[str, float | int]]:
    """MAPE (%) per metric over the phases not saturated and over the saturated ones, with their counts."""
    out = {}
    for saturated in (False, True):
        group = [r for r in rows if r["saturated"] == saturated]
        out["saturated" if saturated else "not_saturated"] = {
            "phases": len(group), **{m: float(np.mean([abs(r[f"{m}_error_pct"]) for r in group]))
                                     if group else float("nan") for m in METRICS}}
    return out


# vLLM's CI latency tests (vllm-project/vllm .buildkite/nightly-benchmarks/tests/descriptions.md: 32 input and
# 128 output tokens, a fixed batch of 8, offline), their medians read back from the README's sentence
CI_REQUESTS, CI_PROMPT, CI_OUTPUT = 8, 32, 128
CI_MODELS = {"llama-3-70b": "llama-3.1-70b"}  # the same shape (the 3.1's longer context is not used here)
CI_CASE = re.compile(r"([A-Za-z][\w.\-]*) TP(\d+) ((?:[\d.]+ s \([\w\-]+\)(?:, )?)+)")
CI_RESULT = re.compile(r"([\d.]+) s \(([\w\-]+)\)")


def ci_cases(readme: str) -> list[tuple[str, str, int, float]]:
    """(catalogue model, catalogue GPU, TP, measured batch latency s) of each CI case the README lists."""
    return [(CI_MODELS.get(m.lower(), m.lower()), gpu.lower(), int(tp), float(s))
            for m, tp, results in CI_CASE.findall(readme) for s, gpu in CI_RESULT.findall(results)]


def ci_batch_s(model: str, gpu: str, tp: int, allreduce: str) -> float:
    cost = cost_model(model, gpu, tp, allreduce)
    profile = VLLMProfile(*policy_class("vllm-v1").memory_profile({}, gpu))
    kv = kv_capacity_tokens(get_model(model), get_gpu(gpu), tp, profile=profile)
    policy = make_policy("vllm-v1", kv, CI_PROMPT + CI_OUTPUT, {}, gpu)
    q = simulate([Request(i, 0.0, CI_PROMPT, CI_OUTPUT) for i in range(CI_REQUESTS)], policy, cost)
    return float(q.request_columns["completion_s"].max())


def ci_row(model: str, gpu: str, tp: int, latency_s: float) -> dict:
    """A CI case predicted with the roofline's default all-reduces (vLLM's) and with NCCL's ring (`_nccl`)."""
    row = {"model": model, "gpu": gpu, "tp": tp, "measured_s": latency_s}
    for suffix, mode in (("", "vllm"), ("_nccl", "nccl")):
        batch = ci_batch_s(model, gpu, tp, mode)
        row[f"predicted{suffix}_s"], row[f"error{suffix}_pct"] = batch, 100.0 * (batch / latency_s - 1.0)
    return row


PHASE_HEADER = ("| file | phase | n | TTFT P50 ms meas / pred | err | TPOT P50 ms meas / pred | err | "
                "E2E P50 s meas / pred | err |")
CI_HEADER = ("| model | GPU | TP | measured s | predicted s | err | predicted s, NCCL's ring | err |")


def markdown(rows: list[dict], ci: list[dict], kv: list[dict]) -> str:
    intro = ("`python bench/gpu_serving.py` (simctl issue 39; what is compared: its docstring). Errors are "
             "predicted / measured - 1; a phase marked * is saturated.")
    lines = ["# The vllm-v1 twin on the roofline against vLLM serving on GPUs", "", intro, "", PHASE_HEADER,
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        cells = [f"{r['ttft_measured'] * 1e3:.1f} / {r['ttft_predicted'] * 1e3:.1f}",
                 f"{r['tpot_measured'] * 1e3:.2f} / {r['tpot_predicted'] * 1e3:.2f}",
                 f"{r['e2e_measured']:.3f} / {r['e2e_predicted']:.3f}"]
        errs = [f"{r[f'{m}_error_pct']:+.1f}%" for m in METRICS]
        lines.append(f"| {r['file']} | {r['phase']}{' *' if r['saturated'] else ''} | {r['requests']} | "
                     + " | ".join(f"{c} | {e}" for c, e in zip(cells, errs)) + " |")
    lines += ["", "| phases | n | MAPE TTFT | MAPE TPOT | MAPE E2E | target |",
              "|---|---:|---:|---:|---:|---:|"]
    for key, v in mape(rows).items():
        target = TARGETS[key == "saturated"]
        lines.append(f"| {key.replace('_', ' ')} | {v['phases']} | "
                     + " | ".join(f"{v[m]:.1f}%" for m in METRICS) + f" | {target:.0f}% |")
    if ci:
        title = (f"vLLM CI latency ({CI_REQUESTS} requests x {CI_PROMPT} prompt + {CI_OUTPUT} output tokens "
                 "at once; batch latency):")
        lines += ["", title, "", CI_HEADER, "|---|---|---:|---:|---:|---:|---:|---:|"]
        lines += [f"| {c['model']} | {c['gpu']} | {c['tp']} | {c['measured_s']:.3f} | "
                  f"{c['predicted_s']:.3f} | {c['error_pct']:+.1f}% | {c['predicted_nccl_s']:.3f} | "
                  f"{c['error_nccl_pct']:+.1f}% |" for c in ci]
        vllm, nccl = (np.mean([abs(c[f"error{k}_pct"]) for c in ci]) for k in ("", "_nccl"))
        lines.append(f"\nMAPE {vllm:.1f}% (target {CI_TARGET:.0f}%); with NCCL's ring (`--allreduce nccl`) "
                     f"{nccl:.1f}%")
    if kv:
        title = ("KV cache vLLM reports (blocks x 16 tokens), predicted by `costs/kv_capacity.py` against "
                 "the README's nearest for the model:")
        lines += ["", title, "",
                  "| file | model | max_num_batched_tokens | predicted | reported | err |",
                  "|---|---|---:|---:|---:|---:|"]
        lines += [f"| {k['file']} | {k['model']} | {k['max_num_batched_tokens']} | {k['predicted']:,} | "
                  f"{k['reported']:,} | {k['error_pct']:+.2f}% |" for k in kv]
    return "\n".join(lines) + "\n"


# the KV sizes vLLM reported, as the README lists them ("40,592 or 44,640 tokens for CodeLlama-34B")
KV_REPORTED = re.compile(r"((?:[\d,]+(?: or )?)+)(?: tokens)? for ([A-Za-z][\w.\-]*)")
KV_SENTENCE = re.compile(r"the KV cache vLLM reported:([^;]*;[^;]*)")


def kv_rows(readme: str) -> list[dict]:
    """Each file's KV size as vLLM would report it, predicted, against the nearest the README gives for its
    model (the README does not say which file reported which)."""
    reported = {m.lower(): [int(v.replace(",", "")) for v in sizes.split(" or ")]
                for said in KV_SENTENCE.findall(readme) for sizes, m in KV_REPORTED.findall(said)}
    out = []
    for c in CASES:
        sizes = reported.get(c.model.name, reported.get(f"{c.model.name}-instruct"))
        if sizes:
            pred = c.kv_reported()
            near = min(sizes, key=lambda s: abs(s - pred))
            out.append({"file": c.file, "model": c.model.name,
                        "max_num_batched_tokens": c.max_num_batched_tokens, "predicted": pred,
                        "reported": near, "error_pct": 100.0 * (pred / near - 1.0)})
    return out


def run(root: Path) -> tuple[list[dict], list[dict], list[dict]]:
    """Every phase of every file present, every CI case the README lists, and the KV sizes."""
    rows = [r for c in CASES if (root / c.file).is_file()
            for r in phase_rows(c, pd.read_csv(root / c.file))]
    readme = root / "README.md"
    text = readme.read_text(encoding="utf-8") if readme.is_file() else ""
    return rows, [ci_row(*c) for c in ci_cases(text)], kv_rows(text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", type=Path, default=REFERENCE, help="the reference folder")
    p.add_argument("--out", type=Path, default=OUT, help="writes OUT.md and OUT.json")
    a = p.parse_args(argv)
    if not a.root.is_dir():
        print(f"skipped: no reference measurements at {a.root}")
        return 0
    rows, ci, kv = run(a.root)
    text = markdown(rows, ci, kv)
    print(text)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.with_suffix(".md").write_text(text, encoding="utf-8")
    report = {"phases": rows, "mape": mape(rows), "ci": ci, "kv": kv}
    a.out.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
