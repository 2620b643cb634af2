"""llm-d's "KV-cache wins you can see" experiment (llm-d blog, 2025-09-24; its workload and scheduler
configurations: llm-d-kv-cache-manager benchmarking/73-capacity/README.md), simulated on the roofline.

Setting, as published: Qwen3-32B, 8 vLLM replicas of 2 H100s (TP2), 307,328 KV tokens per replica;
inference-perf's shared_prefix data: 150 groups, a 6,000-token system prompt each, 5 prompts per group with
a 1,200-token question each (so 750 distinct prompts of 7,200 tokens, shuffled once and sent in that order,
cycling), 1,000 output tokens (ignore_eos); Poisson arrivals in stages: a warm-up of 15 QPS for 50 s, then
3 -> 60 QPS (STAGES), int(rate x seconds) requests each. As inference-perf sends them (its load generator's
`run_stage`, inference_perf/loadgen/load_generator.py): a stage's requests are sent only once every request
of the stages before it has completed, then a 1 s pause (`sim.cluster.Staged`); `--open-loop` sends the
stages back to back instead, so a saturated router's backlog grows through the ladder. Routers: `random`,
`load` (queue and KV scorers 1:1), `prefix-approx` (prefix, KV and queue scorers 1:1:1, an index of 31,250
blocks of 64 tokens per replica), `prefix` (precise, 3:2:2, the report's weights); and `kv-cost` (Dynamo's
KV router, which the report did not run). llm-d's scorers of queues and KV use read the replicas' metrics as
its endpoint picker scrapes them, every 50 ms by default (`SCRAPE_S`; `--router-lag`, 0: as they are).

The twin: vllm-v1 with vLLM's H100 serving defaults but 64-token blocks (the report's indexer block size,
which must match vLLM's); a prompt's blocks are keyed by content with Mooncake-style block ids of 1,200
tokens (five for its group's system prompt, one for its question), so requests share exactly what the
published prompts share. Each stage's output throughput is inference-perf's: the output tokens of the
stage's requests over the time from its first send to the last of them completing (its per-stage reports
divide by that span: reportgen/base.py); the summary is the mean over the ladder's stages (the report's
summary row is the mean of its per-stage rows: 8,730.0 for precise) and P90 TTFT is over every request sent
during the ladder. Beside it, what the GPUs generated: output tokens produced per second from the ladder's
first send to its last completion (a request's tokens spread evenly from its first token to its completion).

Usage: python bench/routing_llmd.py [--routers random,load,prefix-approx,prefix] [--stages N] [--output T]
       [--router-lag S] [--open-loop]
Writes bench/results/routing.md, routing.json and routing.png.
"""

from __future__ import annotations

import argparse
import datetime
import json
import time
from dataclasses import dataclass
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import simpy
from scipy import stats

from simctl.costs.base import CostModel
from simctl.policies.base import run_stats
from simctl.policies.registry import make_policy
from simctl.serving.cache_routers import Random
from simctl.serving.routers import RouterSettings
from simctl.sim.cluster import Cluster
from simctl.sim.cluster_run import make_pool
from simctl.sim.replica import CostBackend
from simctl.sim.run import RunConfig, deploy
from simctl.traces.request import Request

RESULTS = Path(__file__).resolve().parents[1] / "bench" / "results"
NOTES = "<!-- notes: kept when the tables above are regenerated -->"
MODEL, GPU, TP, REPLICAS = "qwen3-32b", "h100", 2, 8
KV_TOKENS = 307_328  # per replica, as published (the roofline gives 323,490 at vLLM's 0.9 memory share)
BLOCK = 64
GROUPS, USERS, SYSTEM, QUESTION, OUTPUT = 150, 5, 6000, 1200, 1000  # OUTPUT: as configured
PAUSE_S = 1.0  # inference-perf's pause between stages (its `interval` default)
WARMUP = (15.0, 50.0)
STAGES = [(3, 20), (10, 20), (15, 20), (20, 38), (22, 34), (25, 30), (30, 25), (35, 21), (40, 38), (43, 36),
          (46, 33), (49, 30), (52, 29), (55, 27), (57, 26), (60, 25)]  # (QPS, seconds)
# router -> (llm-d's name, its weights (prefix, KV, queue), published output tok/s and P90 TTFT s; NaN: not
# in the report)
ROUTERS: dict[str, tuple[str, tuple[float, float, float], float, float]] = {
    "random": ("random-scheduling", (0.0, 0.0, 0.0), 4428.7, 92.551),
    "load": ("load-scheduling", (0.0, 1.0, 1.0), 4266.4, 94.865),
    "prefix-approx": ("estimated-scheduling", (1.0, 1.0, 1.0), 6944.4, 31.083),
    "prefix": ("precise-scheduling", (3.0, 2.0, 2.0), 8730.0, 0.542),
    "kv-cost": ("Dynamo's KV router, not in llm-d's report", (0.0, 0.0, 0.0), float("nan"), float("nan")),
}
# The report's per-stage rows (its "Per-QPS Results", in STAGES order): output tok/s and P90 TTFT s per
# router. Its summary row is their mean (tok/s) and the P90 over every request (TTFT).
PUBLISHED_STAGES: dict[str, tuple[list[float], list[float]]] = {
    "random": ([1314.0, 3568.5, 3791.1, 4933.1, 4765.4, 4781.3, 4636.3, 4332.6, 4773.8, 4844.6, 4969.5,
                4783.2, 4845.1, 4921.7, 4764.2, 4835.2],
               [0.82, 1.398, 2.299, 70.273, 78.42, 82.943, 86.182, 91.519, 101.272, 101.142, 101.265,
                103.514, 105.004, 104.321, 106.816, 105.988]),
    "load": ([1274.8, 3607.0, 3348.4, 4902.5, 4785.5, 4872.8, 4888.7, 4660.7, 4946.4, 4973.3, 4723.6, 4004.8,
              3991.0, 4671.9, 3866.5, 4745.1],
             [1.609, 4.124, 7.002, 77.707, 72.972, 85.979, 83.806, 88.086, 100.911, 101.524, 105.884, 105.015,
              108.572, 110.681, 113.278, 110.184]),
    "prefix-approx": ([1310.9, 3842.4, 5152.9, 8082.6, 8415.7, 8445.1, 8435.9, 7443.5, 8045.9, 7969.6, 7695.2,
                       7455.9, 7452.3, 7100.7, 7013.8, 7247.9],
                      [0.497, 0.499, 0.4, 0.6, 0.7, 0.609, 0.708, 2.459, 43.018, 43.515, 44.93, 46.335,
                       47.284, 50.108, 49.93, 50.226]),
    "prefix": ([1219.1, 3902.1, 5761.1, 9184.5, 9382.0, 9242.2, 9221.8, 9780.6, 10270.8, 10054.8, 10128.7,
                10296.5, 10284.6, 10140.9, 10313.9, 10496.9],
               [0.498, 0.6, 0.4, 0.6, 0.5, 0.583, 0.509, 0.5, 0.488, 0.5, 0.589, 0.6, 0.507, 0.6, 0.6, 0.5]),
}
# llm-d's endpoint picker scrapes every vLLM's /metrics (its waiting-queue and KV-usage gauges, which vLLM
# updates once per engine step) every 50 ms: gateway-api-inference-extension's --refresh-metrics-interval
# default (pkg/epp/server/runserver.go, DefaultRefreshMetricsInterval); the report sets no other. Its queue
# and KV scorers read that copy; the precise prefix scorer reads KV events and the approximate one its own
# index, which the twin gives them as they are. Dynamo's router (kv-cost) counts the requests it sent.
SCRAPE_S = 0.05
SCRAPED = ("load", "prefix-approx", "prefix")


def requests(stages: list[tuple[float, float]], output: int = OUTPUT, seed: int = 0
             ) -> tuple[list[Request], list[int]]:
    """The published workload's requests and the stage each was sent in (0: the warm-up): int(rate x seconds)
    per stage, their Poisson gaps scaled to fill the stage (as inference-perf's Poisson timer does)."""
    rng = np.random.default_rng(seed)
    order = rng.permutation(GROUPS * USERS)  # inference-perf shuffles its prompts once, then cycles
    out, stage_of, t0 = [], [], 0.0
    for k, (qps, seconds) in enumerate([WARMUP, *stages]):
        gaps = rng.exponential(1.0 / qps, int(qps * seconds))
        for t in t0 + np.cumsum(gaps * seconds / gaps.sum()):
            prompt = int(order[len(out) % len(order)])
            group = prompt // USERS  # the group's system prompt: 5 block ids of its own, the question 1
            ids = tuple(group * 5 + j for j in range(SYSTEM // QUESTION)) + (GROUPS * USERS + prompt,)
            out.append(Request(len(out), float(t), SYSTEM + QUESTION, output, hash_ids=ids,
                               hash_block=QUESTION))
            stage_of.append(k)
        t0 += seconds
    return out, stage_of


@dataclass
class Result:
    router: str
    output: int  # tokens per request
    stage_qps: list[float]
    stage_tok_s: list[float]
    stage_ttft_p90: list[float]
    tok_s: float  # mean over the ladder's stages
    made_tok_s: float  # output tokens generated during the ladder, per second
    ttft_p90: float  # over the ladder's requests
    ttft_mean: float
    hit_rate: float
    cpu_s: float  # the simulation's CPU seconds


def cluster_of(router: str, caching: bool = True, lag: float = SCRAPE_S, seed: int = 0,
               cost: CostModel | None = None) -> Cluster:
    """The published deployment behind `router` (vllm-v1 replicas, prefix caching on unless `caching` is
    False), its KV forced to the published size; an llm-d router that reads scraped metrics (`SCRAPED`) sees
    the replicas' queues and KV use as snapshots `lag` seconds apart, `random` draws from `seed`. `cost`
    prices the steps in place of the roofline's defaults (research/routing_llmd_prefill.py)."""
    d = deploy(RunConfig(policy="vllm-v1", model=MODEL, gpu=GPU, tp=TP), GPU, TP)
    cluster = Cluster(simpy.Environment(), None, d.model.kv_bytes_per_token())
    options = {"block_size": BLOCK, "enable_prefix_caching": int(caching)}

    def policy():
        return make_policy("vllm-v1", KV_TOKENS, d.model.max_position, options, GPU)

    weights = ROUTERS[router][1] if router in ROUTERS else RouterSettings().weights
    settings = RouterSettings(weights=weights, index_tokens=31_250 * 64)
    cluster.entry = make_pool("replicas", REPLICAS, GPU, lambda: CostBackend(cost or d.cost), policy, router,
                              cluster, None, TP, settings, lag if router in SCRAPED else 0.0)
    if router == "random":
        cluster.entry.router = Random(seed)
    return cluster


def speed(n: int, qps: float = 12.0, reps: int = 3) -> str:
    """Simulation speed: `n` requests of the workload at a rate both deployments sustain, prefix caching with
    the precise router against no caching behind round-robin (issue 40's target: within 2x); medians of
    `reps` runs each, alternating, in CPU seconds of this process (on a shared machine the wall time is mostly
    the other processes' load)."""
    reqs = [r for r in requests([(qps, n / qps)])[0] if r.arrival_s >= WARMUP[1]][:n]
    setups = {"prefix, caching": ("prefix", True), "round-robin, no caching": ("round-robin", False)}
    cpu: dict[str, list[float]] = {label: [] for label in setups}
    for _ in range(reps):
        for label, (router, caching) in setups.items():
            cluster = cluster_of(router, caching)
            t0 = time.process_time()
            cluster.run(reqs)
            cpu[label].append(time.process_time() - t0)
            print(f"speed {label}: {cpu[label][-1]:.2f} CPU s for {len(reqs)} requests", flush=True)
    a, b = (float(np.median(c)) for c in cpu.values())
    return (f"\n## Simulation speed\n\n{len(reqs)} requests at {qps:g} QPS, 8 replicas, medians of {reps} "
            "alternating runs, CPU seconds: " + ", ".join(f"{k} {np.median(v):.2f} s" for k, v in cpu.items())
            + f" (ratio {a / b:.2f}).\n")


def serve(router: str, reqs: list[Request], stage_of: list[int], stages: list[tuple[float, float]],
          drained: bool = True, lag: float = SCRAPE_S, seed: int = 0, cost: CostModel | None = None
          ) -> Result:
    cluster = cluster_of(router, lag=lag, seed=seed, cost=cost)
    t0 = time.process_time()  # the machine is shared: its wall time is mostly the other processes' load
    seqs = cluster.run(reqs, stages=stage_of if drained else None, pause_s=PAUSE_S)
    cpu = time.process_time() - t0
    sent = np.array([s.arrival_s for s in seqs])
    first = np.array([s.first_token_s for s in seqs])
    ttft = first - sent
    done = np.array([s.completion_s for s in seqs])
    out = np.array([s.output_tokens for s in seqs])
    stage = np.array(stage_of)
    tok_s, p90 = [], []
    for k in range(1, len(stages) + 1):
        mine = stage == k  # inference-perf: the stage's requests' tokens over their first send to last end
        tok_s.append(float(out[mine].sum() / (done[mine].max() - sent[mine].min())))
        p90.append(float(np.percentile(ttft[mine], 90)))
    ladder = stage > 0
    a, b = sent[ladder].min(), done[ladder].max()
    made = generated(first, done, out, a, b) / (b - a)
    stats = run_stats([m.policy for m in cluster.entry.members])
    return Result(router, int(out[0]), [q for q, _ in stages], tok_s, p90, float(np.mean(tok_s)), made,
                  float(np.percentile(ttft[ladder], 90)), float(ttft[ladder].mean()),
                  float(stats["prefix_cache_hit_rate"]), cpu)


def generated(first: np.ndarray, done: np.ndarray, out: np.ndarray, a: float, b: float) -> float:
    """Output tokens generated in [a, b): each request's first token at its instant, the others spread evenly
    from its first token to its completion (what a dashboard's output-token rate shows)."""
    span = np.maximum(done - first, 1e-12)
    overlap = np.clip(np.minimum(done, b) - np.maximum(first, a), 0.0, None)
    return float(((first >= a) & (first < b)).sum() + ((out - 1) * overlap / span).sum())


def report(results: list[Result]) -> str:
    lines = ["# llm-d's precise prefix-cache scheduling experiment, simulated", "",
             (f"Run {datetime.date.today()}: `python bench/routing_llmd.py --speed 3000 --speed-reps 5` (the "
              "setting: its docstring). "
              "Qwen3-32B, 8 replicas of 2 H100 (roofline), 307,328 KV tokens each, 150 groups x 5 prompts "
              "of 6,000 + 1,200 tokens, Poisson stages 3 -> 60 QPS after a 15-QPS warm-up, each stage sent "
              "once the stages before it have completed, plus 1 s (as inference-perf sends them); llm-d's "
              "routers read the replicas' queues and KV use as scraped every 50 ms. Output tok/s: "
              "inference-perf's per-stage throughput, averaged over the ladder's stages; P90 TTFT over the "
              "ladder's requests; generated tok/s: output tokens produced per second from the ladder's first "
              "send to its last completion.")]
    for output in dict.fromkeys(r.output for r in results):
        rs = [r for r in results if r.output == output]
        lines += ["", f"## {output} output tokens per request", "",
                  ("| router (llm-d's) | output tok/s | published | P90 TTFT s | published | mean TTFT s | "
                   "generated tok/s | hit rate | sim CPU s |"), "|---|" + "---:|" * 8]
        for r in rs:
            name, _, tok, ttft = ROUTERS[r.router]
            tok_s, p90 = ("-", "-") if np.isnan(tok) else (f"{tok:,.0f}", f"{ttft:.3g}")
            lines.append(f"| {r.router} ({name}) | {r.tok_s:,.0f} | {tok_s} | {r.ttft_p90:.3g} | {p90} | "
                         f"{r.ttft_mean:.3g} | {r.made_tok_s:,.0f} | {r.hit_rate:.1%} | {r.cpu_s:.0f} |")
        by = {r.router: r for r in rs}
        if "prefix" in by and "random" in by:
            ratio = by["prefix"].tok_s / by["random"].tok_s
            published = 8730.0 / 4428.7
            lines += ["", f"Precise / random output throughput: {ratio:.2f} (published {published:.2f})."]
        lines += order(rs)
        if output == OUTPUT and len(rs[0].stage_qps) == len(STAGES):
            lines += per_stage(rs)
    return "\n".join(lines) + "\n"


def per_stage(rs: list[Result]) -> list[str]:
    """Each stage's output tok/s beside the report's row for it, each router's mean absolute error over the
    stages, and load against random stage by stage: how far the published order stands above the published
    run's own stage-to-stage spread."""
    rs = [r for r in rs if r.router in PUBLISHED_STAGES]
    lines = ["", "### Per stage, output tok/s (published in brackets)", "",
             "| QPS | " + " | ".join(r.router for r in rs) + " |", "|---:|" + "---:|" * len(rs)]
    for k, qps in enumerate(rs[0].stage_qps):
        lines.append(f"| {qps:g} | " + " | ".join(
            f"{r.stage_tok_s[k]:,.0f} ({PUBLISHED_STAGES[r.router][0][k]:,.0f})" for r in rs) + " |")
    errors = [f"{r.router} {np.mean(np.abs(np.array(r.stage_tok_s) / PUBLISHED_STAGES[r.router][0] - 1)):.0%}"
              for r in rs]
    lines += ["", "Mean absolute error per stage: " + ", ".join(errors) + "."]
    by = {r.router: r for r in rs}
    if "load" in by and "random" in by:
        published = np.divide(PUBLISHED_STAGES["load"][0], PUBLISHED_STAGES["random"][0]) - 1
        simulated = np.divide(by["load"].stage_tok_s, by["random"].stage_tok_s) - 1
        # is the published order above its own stage-to-stage spread, and is simctl's spread the same?
        t, w = stats.ttest_1samp(published, 0.0).pvalue, stats.wilcoxon(published).pvalue
        welch = stats.ttest_ind(published, simulated, equal_var=False).pvalue
        mw = stats.mannwhitneyu(published, simulated).pvalue
        head = "Load against random, per stage (load's output tok/s over random's, less 1): "
        lines += ["", head + "; ".join(
            f"{what} mean {d.mean():+.1%}, median {np.median(d):+.1%}, sd {d.std(ddof=1):.1%}, load ahead in "
            f"{(d > 0).sum()} of {len(d)} stages" for what, d in (("published", published),
                                                                   ("simulated", simulated)))
            + f". Published, load less random against 0: paired t-test p = {t:.2f}, Wilcoxon p = {w:.2f}; "
            f"simulated against published: Welch p = {welch:.2f}, Mann-Whitney p = {mw:.2f}."]
    return lines


def order(rs: list[Result]) -> list[str]:
    """The llm-d routers ranked by throughput (highest first) and by P90 TTFT (lowest first), beside the
    published ranking."""
    rs = [r for r in rs if not np.isnan(ROUTERS[r.router][2])]
    lines = []
    for what, mine, theirs in (("output tok/s", lambda r: -r.tok_s, lambda r: -ROUTERS[r.router][2]),
                               ("P90 TTFT", lambda r: r.ttft_p90, lambda r: ROUTERS[r.router][3])):
        ranked = " > ".join(r.router for r in sorted(rs, key=mine))
        published = " > ".join(r.router for r in sorted(rs, key=theirs))
        lines.append(f"Order by {what}, best first: {ranked} (published: {published}).")
    return ["", " ".join(lines)] if lines else []


def figure(results: list[Result], path: Path) -> None:
    outputs = list(dict.fromkeys(r.output for r in results))
    fig, axes = plt.subplots(len(outputs), 2, figsize=(12, 5 * len(outputs)), squeeze=False)
    for (a, b), output in zip(axes, outputs):
        for r in (r for r in results if r.output == output):
            line, = a.plot(r.stage_qps, r.stage_tok_s, marker="o", label=r.router)
            b.plot(r.stage_qps, r.stage_ttft_p90, marker="o", label=r.router)
            if output == OUTPUT and r.router in PUBLISHED_STAGES and len(r.stage_qps) == len(STAGES):
                tok, ttft = PUBLISHED_STAGES[r.router]
                style = {"color": line.get_color(), "ls": "--", "marker": "o", "mfc": "none", "alpha": 0.7}
                a.plot(r.stage_qps, tok, label=f"{r.router}, published", **style)
                b.plot(r.stage_qps, ttft, **style)
        a.set(xlabel="offered rate (QPS)", ylabel="output tokens/s",
              title=f"Output tokens/s per stage, inference-perf's ({output}-token answers)")
        b.set(xlabel="offered rate (QPS)", ylabel="P90 TTFT (s)", yscale="log",
              title=f"P90 TTFT of the stage's requests ({output}-token answers)")
        a.legend(fontsize=7, ncol=2)
    fig.suptitle("llm-d's experiment simulated (solid) and published (dashed, hollow): Qwen3-32B, "
                 "8 x TP2 H100")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", default=",".join(ROUTERS))
    parser.add_argument("--stages", type=int, default=len(STAGES), help="the first N stages of the ladder")
    parser.add_argument("--output", default=str(OUTPUT), help="output tokens per request, comma-separated")
    parser.add_argument("--speed", type=int, default=0, help="also time N requests (prefix vs round-robin)")
    parser.add_argument("--speed-reps", type=int, default=3, help="runs of each for --speed (medians)")
    parser.add_argument("--router-lag", type=float, default=SCRAPE_S,
                        help=f"seconds between the snapshots of the replicas' load that {', '.join(SCRAPED)} "
                             f"read (llm-d's metrics scrape) [default: {SCRAPE_S}, llm-d's; 0: exact]")
    parser.add_argument("--open-loop", action="store_true",
                        help="send the stages back to back, not each after the previous one completed")
    args = parser.parse_args()
    stages = STAGES[:args.stages]
    results = []
    for output in (int(o) for o in args.output.split(",")):
        reqs, stage_of = requests(stages, output)
        for router in args.routers.split(","):
            results.append(serve(router, reqs, stage_of, stages, not args.open_loop, args.router_lag))
            r = results[-1]
            print(f"{output} {router}: {r.tok_s:,.0f} tok/s, P90 TTFT {r.ttft_p90:.3g} s, "
                  f"hits {r.hit_rate:.1%}, {r.cpu_s:.0f} CPU s", flush=True)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "routing.json").write_text(json.dumps([r.__dict__ for r in results], indent=1))
    figure(results, RESULTS / "routing.png")
    text = report(results) + (speed(args.speed, reps=args.speed_reps) if args.speed else "")
    md = RESULTS / "routing.md"
    notes = md.read_text().partition(NOTES)[2] if md.exists() else ""  # the hand-written analysis stays
    md.write_text(text + "\n" + NOTES + notes)
    print(text)


if __name__ == "__main__":
    main()
