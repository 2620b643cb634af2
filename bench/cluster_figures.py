"""Cluster figures (issue 10), simulated on the roofline:

1. DistServe-style (its chatbot setting): Llama-2-13B on A100-80GB, sharegpt lengths x0.5 (so that every request
   fits Llama-2's 4,096-token context), colocated vllm and sarathi (one replica) against disaggregated 1P1D,
   2P1D and 1P2D (vllm's continuous batching on every instance, KV over a 200 Gbit/s link): goodput per GPU
   under per-request TTFT and TPOT limits met by 90% of requests (sim.goodput), and SLO attainment against
   the rate per GPU (cluster_goodput.png, cluster_goodput.md).
2. Routers at 8 replicas (vllm, Mistral-7B, A100-80GB) on bursty arrivals: sharegpt with gamma inter-arrivals
   (cv 3), and the real arrival pattern of splitwise_conv.csv (time-scaled to the same rate) when it is
   present; each at 70% of 8 times one replica's capacity (cluster_routers.md).

Usage: python bench/cluster_figures.py [--requests N]   (about 10 minutes on 2 shared cores at 1,000)
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np

from serving.routers import ROUTERS
from sim.capacity import find_capacity
from sim.cluster_run import ClusterConfig
from sim.goodput import deployment_name, find_goodput, with_attainment
from sim.run import RunConfig, run
from sim.slo import SLO, parse_slo

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
SPLITWISE = ROOT.parent / "shared" / "reference" / "traces" / "splitwise_conv.csv"
# DistServe's chatbot SLO for a 13B model is TTFT 0.25 s, TPOT 0.1 s, 90% attainment (OPT-13B, whose
# 2,048-token context keeps prompts short). Here even an idle replica misses TTFT 0.25 s for over 10% of
# requests (unloaded P90 TTFT 0.35 s on the roofline: sharegpt x0.5 keeps prompts up to 4k), so the TTFT limit
# is relaxed to 0.5 s; TPOT stays 0.1 s.
SLO_LIMITS = "ttft=0.5,tpot=0.1"
LINK_GBPS = 200.0
DEPLOYMENTS = [("vllm", ClusterConfig()), ("sarathi", ClusterConfig())] + [
    ("vllm", ClusterConfig(prefill_instances=p, decode_instances=d, kv_link_gbps=LINK_GBPS))
    for p, d in ((1, 1), (2, 1), (1, 2))]


def label(policy: str, cc: ClusterConfig) -> str:
    return f"{policy} colocated" if not cc.disaggregated else f"{deployment_name(cc)} ({policy})"


def distserve(n: int) -> str:
    base = RunConfig(policy="vllm", trace="sharegpt", model="llama-2-13b", gpu="a100-80gb", scale=0.5,
                     num_requests=n, seed=0)
    slo = parse_slo([SLO_LIMITS], 0.9)
    rows, curves = [], {}
    for policy, cc in DEPLOYMENTS:
        config = replace(base, policy=policy)
        g = find_goodput(config, cc, slo, start_qps=1.0)
        rows.append({**g.row(), "deployment": label(policy, cc)})
        rates = np.linspace(0.1, 2.5 * max(g.per_gpu, 0.2), 10)  # per GPU
        curves[label(policy, cc)] = [
            (float(r), with_attainment(s.summary, s.result.requests, slo)["slo_attainment"])
            for r in rates for s in [run(replace(config, qps=float(r) * g.gpus), cc)]]
        print(rows[-1]["deployment"], f"goodput {g.per_gpu:.3f} req/s/GPU")
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, pts in curves.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=name)
    ax.axhline(0.9, color="grey", ls="--", lw=1)
    ax.set_xlabel("rate per GPU (requests/s)")
    ax.set_ylabel(f"SLO attainment ({SLO_LIMITS})")
    ax.set_title("Llama-2-13B, A100-80GB, sharegpt x0.5 (simulated, roofline)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "cluster_goodput.png", dpi=120)
    lines = [f"# Goodput per GPU: Llama-2-13B on A100-80GB, sharegpt x0.5, {n} requests per probe",
             "", f"SLO: {slo.describe()}; KV link {LINK_GBPS:g} Gbit/s. `python bench/cluster_figures.py`.", "",
             "| deployment | GPUs | rate at SLO (req/s) | goodput (req/s/GPU) | attainment there | TTFT P90 | TPOT P90 |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['deployment']} | {r['gpus']} | {r['goodput_qps']:.3f} | {r['goodput_per_gpu']:.3f} | "
              f"{_f(r['slo_attainment'])} | {_f(r['ttft_p90'])} | {_f(r['tpot_p90'])} |" for r in rows]
    (RESULTS / "cluster_goodput.json").write_text(json.dumps({"rows": rows, "curves": curves}, indent=1) + "\n")
    return "\n".join(lines) + "\n"


def _f(v: float | None) -> str:
    return "-" if v is None else f"{v:.3f}"


def routers(n: int) -> str:
    base = RunConfig(policy="vllm", trace="sharegpt", model="mistral-7b", gpu="a100-80gb", num_requests=n, seed=0)
    one = find_capacity(replace(base, num_requests=max(n, 500)), SLO()).qps
    qps = 0.7 * 8 * one
    slo = parse_slo(["ttft=2,tpot=0.1"], 0.9)
    traces = [("sharegpt, gamma cv 3", replace(base, qps=qps, arrival="gamma", cv=3.0))]
    if SPLITWISE.is_file():
        traces.append(("splitwise_conv.csv arrivals, time-scaled", replace(base, trace=str(SPLITWISE), qps=qps)))
    else:
        print(f"skipped: {SPLITWISE} is absent")
    lines = [(f"# Routers at 8 replicas: vllm, Mistral-7B, A100-80GB, {n} requests at {qps:.2f} req/s "
             f"(70% of 8 x {one:.2f}, one replica's capacity)"), "", "`python bench/cluster_figures.py`.", ""]
    for name, config in traces:
        lines += [f"## {name}", "", ("| router | TTFT P50 | TTFT P99 | TBT P99 | E2E P99 | attainment (TTFT<=2, TPOT<=0.1) "
                  "| requests per replica (min..max) | KV peak max |"), "|---|---|---|---|---|---|---|---|"]
        for router in ROUTERS:
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
