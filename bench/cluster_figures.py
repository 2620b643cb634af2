"""Cluster figures (issues 10 and 23), simulated on the roofline:

1. DistServe's chatbot experiment (issue 23): Llama-2-13B (OPT-13B's shape twin) on A100-80GB, the real
   ShareGPT trace (`../shared/reference/traces/`) filtered to prompts and outputs under 2,048 tokens (rows
   dropped, not scaled), SLO TTFT <= 0.25 s and TPOT <= 0.1 s for 90% of requests; colocated vllm at TP1 and
   TP2 against disaggregated placements, DistServe's own (1 prefill instance at TP2, 1 decode instance at
   TP1) among them, the KV on NVLink (2,400 Gbit/s). Goodput per GPU (studies.goodput), SLO attainment against
   the rate per GPU, and the measurements that explain the result: pool occupancy and KV at a common rate,
   and the goodput again with other step overheads, decode batch bounds and decode KV
   (cluster_goodput.png, cluster_goodput.md).
2. Routers at 8 replicas (vllm, Mistral-7B, A100-80GB) on bursty arrivals: sharegpt with gamma inter-arrivals
   (cv 3), and the real arrival pattern of splitwise_conv.csv (time-scaled to the same rate) when it is
   present; each at 70% of 8 times one replica's capacity (cluster_routers.md).

Usage: python bench/cluster_figures.py [--requests N] [--only goodput|routers]
"""

from __future__ import annotations

import argparse
import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import matplotlib

from simctl.traces.workload import Workload

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from simctl.catalogue.gpus import get_gpu
from simctl.costs.calibration import CALIBRATION_FORMAT
from simctl.results.slo import SLO, parse_slo
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig, run
from simctl.studies.capacity import find_capacity
from simctl.studies.goodput import deployment_name, find_goodput, with_attainment

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
REFERENCE = ROOT.parent / "shared" / "reference" / "traces"
SPLITWISE = REFERENCE / "splitwise_conv.csv"
SHAREGPT = REFERENCE / "sharegpt_8k_filtered_stats_llama2_tokenizer.csv"
MAX_LEN = 2048  # DistServe: prompts and outputs under OPT's 2,048-token context
SLO_LIMITS = "ttft=0.25,tpot=0.1"  # DistServe's chatbot SLO for OPT-13B, 90% attainment
LINK_GBPS = 2400.0  # NVLink (300 GB/s): DistServe places a 13B model's prefill and decode in one node
RATES = np.round(np.arange(0.25, 3.01, 0.25), 2)  # per GPU
COMMON_RATE = 1.0  # per GPU: where every deployment's pools are compared
# the routers that see load only (the cache-aware ones: bench/routing_llmd.py)
LOAD_ROUTERS = ("round-robin", "least-outstanding", "least-kv", "shortest-queue")


@dataclass(frozen=True)
class Placement:
    label: str
    tp: int = 1
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    options: dict[str, Any] = field(default_factory=dict)


def pd_(p: int, d: int, ptp: int = 1, dtp: int = 1) -> ClusterConfig:
    return ClusterConfig(prefill_instances=p, decode_instances=d, kv_link_gbps=LINK_GBPS, prefill_tp=ptp,
                         decode_tp=dtp)


def named(cc: ClusterConfig, tp: int = 1) -> Placement:
    return Placement(f"{deployment_name(cc, tp)} vllm" if cc.disaggregated else f"vllm TP{tp}", tp, cc)


DISTSERVE = pd_(1, 1, 2, 1)  # the paper's placement for OPT-13B, chatbot
DEPLOYMENTS = [named(ClusterConfig()), named(ClusterConfig(), 2), named(DISTSERVE), named(pd_(1, 1)),
               named(pd_(2, 1)), named(pd_(1, 2))]


def filtered_sharegpt(folder: Path) -> Path:
    """The reference ShareGPT trace without the rows whose prompt or output reaches MAX_LEN tokens."""
    df = pd.read_csv(SHAREGPT)
    keep = df[(df["num_prefill_tokens"] < MAX_LEN) & (df["num_decode_tokens"] < MAX_LEN)]
    path = folder / "sharegpt_under_2k.csv"
    keep.to_csv(path, index=False)
    return path


def calibration(folder: Path, overhead_s: float) -> str:
    """A roofline calibration of the A100's own efficiencies with another step overhead (`--cost`)."""
    a100 = get_gpu("a100-80gb")
    path = folder / f"overhead_{overhead_s * 1e3:g}ms.json"
    path.write_text(json.dumps({"format": CALIBRATION_FORMAT, "measured_on": "a100-80gb", "params": {
        "mfu": a100.mfu, "mbu": a100.mbu, "attn_mfu": 0.5, "overhead_s": overhead_s}}))
    return str(path)


def config_of(base: RunConfig, d: Placement, **workload: Any) -> RunConfig:
    config = replace(base, tp=d.tp, options={**base.options, **d.options})
    return config.with_workload(**workload) if workload else config


def goodput(base: RunConfig, d: Placement, slo: Any) -> Any:
    return find_goodput(config_of(base, d), d.cluster, slo, start_qps=1.0)


def pools_at(base: RunConfig, d: Placement, per_gpu: float, gpus: int, slo: Any) -> dict[str, Any]:
    """One run at `per_gpu` requests/s per GPU: attainment, latencies and each pool's occupancy."""
    r = run(config_of(base, d, qps=per_gpu * gpus), d.cluster)
    s = with_attainment(r.summary, r.result.requests, slo)
    its = r.iterations
    decode = its[its["prefill_tokens"] == 0]
    prefill = its[its["prefill_tokens"] > 0]
    return {"deployment": d.label, "gpus": gpus, "attainment": s["slo_attainment"], "ttft_p90": s["ttft_p90"],
            "tpot_p90": s["tpot_p90"], "tbt_p99": s["tbt_p99"], "preemptions": s["preemptions"],
            "decode_batch": float(np.average(decode["batch_size"], weights=decode["count"])),
            "decode_step_ms": 1e3 * float(decode["duration_s"].sum() / decode["count"].sum()),
            "prefill_step_ms": 1e3 * float(prefill["duration_s"].mean()),
            "pools": {name: (round(p["utilisation_mean"], 2), p["kv_peak_tokens"],
                             max(m["kv_capacity_tokens"] for m in s["replica_metrics"] if m["pool"] == name))
                      for name, p in s["pools"].items()},
            "link_ms": 1e3 * s["kv_link"]["transfer_s_mean"] if "kv_link" in s else None}


def distserve(n: int) -> str:
    if not SHAREGPT.is_file():
        print(f"skipped: {SHAREGPT} is absent")
        return f"# DistServe's chatbot experiment\n\nNot made: {SHAREGPT} is absent.\n"
    with tempfile.TemporaryDirectory() as tmp:
        return _distserve(n, Path(tmp))


def _distserve(n: int, tmp: Path) -> str:
    trace = filtered_sharegpt(tmp)
    base = RunConfig(policy="vllm", workload=Workload(trace=str(trace), num_requests=n, seed=0),
                     model="llama-2-13b", gpu="a100-80gb")
    slo = parse_slo([SLO_LIMITS], 0.9)
    rows, curves = [], {}
    for d in DEPLOYMENTS:
        g = goodput(base, d, slo)
        rows.append({**g.row(), "deployment": d.label})
        runs = (run(config_of(base, d, qps=float(r) * g.gpus), d.cluster) for r in RATES)
        curves[d.label] = [(float(r), with_attainment(s.summary, s.result.requests, slo)["slo_attainment"])
                           for r, s in zip(RATES, runs)]
        print(d.label, f"goodput {g.per_gpu:.3f} req/s/GPU")
    vllm1 = rows[0]["goodput_per_gpu"]
    occupancy = [pools_at(base, d, COMMON_RATE, row["gpus"], slo) for d, row in zip(DEPLOYMENTS[:3], rows)]
    variants = _variants(base, slo, tmp)
    _figure(curves)
    lengths = pd.read_csv(trace)
    data = {"rows": rows, "curves": curves, "occupancy": occupancy, "variants": variants}
    (RESULTS / "cluster_goodput.json").write_text(json.dumps(data, indent=1) + "\n")
    title = (f"# DistServe's chatbot experiment: Llama-2-13B on A100-80GB, ShareGPT under {MAX_LEN} tokens, "
             f"{n} requests per probe")
    setting = (f"SLO: {slo.describe()}; KV link {LINK_GBPS:g} Gbit/s; the trace keeps {len(lengths)} of the "
               f"reference file's rows (prompt mean {lengths['num_prefill_tokens'].mean():.0f}, output mean "
               f"{lengths['num_decode_tokens'].mean():.0f} tokens). `python bench/cluster_figures.py "
               "--only goodput`.")
    header = ("| deployment | GPUs | rate at SLO (req/s) | goodput (req/s/GPU) | vs vllm TP1 | attainment "
              "there | TTFT P90 | TPOT P90 |")
    lines = [title, "", setting, "", header, "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r['deployment']} | {r['gpus']} | {r['goodput_qps']:.3f} | {r['goodput_per_gpu']:.3f} | "
              f"{r['goodput_per_gpu'] / vllm1:.2f}x | {_f(r['slo_attainment'])} | {_f(r['ttft_p90'])} | "
              f"{_f(r['tpot_p90'])} |" for r in rows]
    header = ("| deployment | attainment | TTFT P90 | TPOT P90 | TBT P99 | preemptions | decode batch | "
              "decode step (ms) | prefill step (ms) | pools: (utilisation, KV peak, KV capacity) | "
              "link (ms) |")
    lines += ["", "![attainment vs rate per GPU](cluster_goodput.png)", "",
              f"## Every pool at {COMMON_RATE:g} req/s per GPU", "", header,
              "|---|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {o['deployment']} | {o['attainment']:.3f} | {o['ttft_p90']:.3f} | {o['tpot_p90']:.3f} | "
              f"{o['tbt_p99']:.3f} | {o['preemptions']} | {o['decode_batch']:.1f} | "
              f"{o['decode_step_ms']:.1f} | {o['prefill_step_ms']:.1f} | {o['pools']} | {_f(o['link_ms'])} |"
              for o in occupancy]
    lines += ["", "## Goodput per GPU when one thing changes (both pools, all three deployments)", "",
              "| change | vllm TP1 | vllm TP2 | 1P1D (prefill TP2, decode TP1) | ratio to vllm TP1 |",
              "|---|---|---|---|---|"]
    lines += [f"| {name} | {v[0]:.3f} | {v[1]:.3f} | {v[2]:.3f} | {v[2] / v[0]:.2f}x |"
              for name, v in variants.items()]
    return "\n".join(lines) + "\n"


def _variants(base: RunConfig, slo: Any, tmp: Path) -> dict[str, list[float]]:
    """Goodput per GPU of vllm TP1, TP2 and DistServe's placement under each change, found by search."""
    three = DEPLOYMENTS[:3]
    changes: dict[str, tuple[RunConfig, list[Placement]]] = {
        "none (roofline defaults)": (base, three),
        "no step overhead": (replace(base, cost=calibration(tmp, 0.0)), three),
        "10 ms per step": (replace(base, cost=calibration(tmp, 0.010)), three),
        "decode batches up to 256 (vLLM's max_num_seqs) instead of 128": (
            base, [replace(d, options={"max_batch_size": 256}) for d in three]),
        "decode batches up to 32": (base, [replace(d, options={"max_batch_size": 32}) for d in three]),
        "decode instance at TP2 (twice its KV and bandwidth; 4 GPUs)": (
            base, [*three[:2], named(pd_(1, 1, 2, 2))]),
        "prefill batches up to 512 tokens (--max-tokens)": (
            base, [*three[:2], replace(three[2], options={"max_tokens": 512})]),
    }
    out = {}
    for name, (config, deps) in changes.items():
        out[name] = [goodput(config, d, slo).per_gpu for d in deps]
        print(name, [f"{v:.3f}" for v in out[name]])
    return out


def _figure(curves: dict[str, list[tuple[float, float]]]) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 4.4))
    for name, pts in curves.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
    ax.axhline(0.9, color="grey", ls="--", lw=1)
    ax.set_xlabel("rate per GPU (requests/s)")
    ax.set_ylabel(f"SLO attainment ({SLO_LIMITS})")
    ax.set_title(f"Llama-2-13B, A100-80GB, ShareGPT < {MAX_LEN} tokens (simulated, roofline)")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(RESULTS / "cluster_goodput.png", dpi=120)


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def routers(n: int) -> str:
    base = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", num_requests=n, seed=0),
                     model="mistral-7b", gpu="a100-80gb")
    one = find_capacity(base.with_workload(num_requests=max(n, 500)), SLO()).qps
    qps = 0.7 * 8 * one
    slo = parse_slo(["ttft=2,tpot=0.1"], 0.9)
    traces = [("sharegpt, gamma cv 3", base.with_workload(qps=qps, arrival="gamma", cv=3.0))]
    if SPLITWISE.is_file():
        traces.append(("splitwise_conv.csv arrivals, time-scaled",
                       base.with_workload(trace=str(SPLITWISE), qps=qps)))
    else:
        print(f"skipped: {SPLITWISE} is absent")
    lines = [(f"# Routers at 8 replicas: vllm, Mistral-7B, A100-80GB, {n} requests at {qps:.2f} req/s "
             f"(70% of 8 x {one:.2f}, one replica's capacity)"), "", "`python bench/cluster_figures.py`.", ""]
    for name, config in traces:
        header = ("| router | TTFT P50 | TTFT P99 | TBT P99 | E2E P99 | attainment (TTFT<=2, TPOT<=0.1) "
                  "| requests per replica (min..max) | KV peak max |")
        lines += [f"## {name}", "", header, "|---|---|---|---|---|---|---|---|"]
        for router in LOAD_ROUTERS:
            r = run(config, ClusterConfig(replicas=8, router=router))
            s = with_attainment(r.summary, r.result.requests, slo)
            reqs = r.replicas["requests"]
            lines.append(f"| {router} | {s['ttft_p50']:.3f} | {s['ttft_p99']:.3f} | {s['tbt_p99']:.3f} | "
                         f"{s['e2e_p99']:.2f} | {s['slo_attainment']:.3f} | {reqs.min()}..{reqs.max()} | "
                         f"{r.replicas['kv_peak_tokens'].max()} |")
            print(name, router, f"ttft p99 {s['ttft_p99']:.3f}")
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--only", choices=("goodput", "routers"))
    args = parser.parse_args()
    RESULTS.mkdir(parents=True, exist_ok=True)
    if args.only != "routers":
        (RESULTS / "cluster_goodput.md").write_text(distserve(args.requests))
    if args.only != "goodput":
        (RESULTS / "cluster_routers.md").write_text(routers(args.requests))


if __name__ == "__main__":
    main()
