"""Why are the simulated llm-d experiment's throughputs (bench/routing_llmd.py) about 2.3x below the published
ones, and why does the precise/random ratio grow with 430-token answers?

Two measurements:
1. `steps`: the roofline's Qwen3-32B TP2 H100 step times for this workload's shapes (a cold 7,200-token
   prompt in 8,192-token chunks, a cached prefix's 1,200-token question, decode steps at the batch sizes the
   KV allows), beside the published run's own ITL means (73-capacity report: 0.011-0.012 s at 3 QPS,
   0.024-0.029 s once saturated).
2. `drained`: the ladder as inference-perf runs it. Its load generator sends a stage's requests, then waits
   until every one of them has finished ("Wait until all requests are finished processing",
   inference_perf/loadgen/load_generator.py, run_stage, in the 2025-09 version 5b1da4d and now), sleeps
   `interval` (1 s by default) and starts the next stage: no backlog crosses a stage. bench/routing_llmd.py
   sends the stages back to back, open loop, so a saturated router's backlog grows through the ladder. Here a
   stage's requests are sent (its Poisson gaps kept) only once the previous stage's requests have all
   completed, plus INTERVAL_S. Per stage, inference-perf's throughput: the successful requests' output
   tokens over (last end - first send) of the stage (reportgen/base.py); a request counts as failed if it
   took longer than aiohttp's default total timeout, 300 s (inference-perf's client sets no other; not
   aborted here, so the server still serves it: an upper bound on the load it leaves).

Usage: python research/routing_llmd_gap.py [--routers random,prefix] [--output 1000,430] [--stages N]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from simctl.policies.plan import BatchPlan, Layout
from simctl.sim.cluster import at
from simctl.sim.run import RunConfig, deploy

sys.path.insert(0, str(Path(__file__).resolve().parent))
from routing_load_random import bench_module  # the bench loaded as a module, as that study does

INTERVAL_S = 1.0  # inference-perf's default pause between stages
CLIENT_TIMEOUT_S = 300.0  # aiohttp's default ClientTimeout(total=300)




def plan(prefill: tuple[int, int] | None = None, decodes: int = 0, context: int = 0) -> BatchPlan:
    """A ragged step: one prefill segment (q new tokens on c cached) and `decodes` rows of `context` KV."""
    q, c = prefill or (0, 0)
    return BatchPlan([], [], Layout.PACKED, q + decodes, decodes + (1 if q else 0),
                     prefill_q=[q] if q else [], prefill_c=[c] if q else [], decode_rows=decodes,
                     decode_kv=decodes * context, prefill_tokens=q, decode_tokens=decodes)


def steps() -> None:
    L = bench_module()
    cost = deploy(RunConfig(policy="vllm-v1", model=L.MODEL, gpu=L.GPU, tp=L.TP), L.GPU, L.TP).cost
    prompt = L.SYSTEM + L.QUESTION
    cold = cost.iteration_time(plan((8192 - 1, 0)))  # vLLM's H100 chunk: 8,192 tokens a step
    print(f"prefill, cold 7,200-token prompt: {cost.iteration_time(plan((prompt, 0))):.3f} s "
          f"(one 8,191-token chunk {cold:.3f} s)")
    print(f"prefill, 1,200-token question on a cached 6,000: "
          f"{cost.iteration_time(plan((L.QUESTION, L.SYSTEM))):.3f} s")
    for b in (1, 8, 16, 37, 64, 128):
        for out in (215, 500):
            t = cost.iteration_time(plan(None, b, prompt + out))
            print(f"decode step, {b:3d} rows at {prompt + out} KV tokens: {t * 1e3:6.1f} ms "
                  f"({b / t:7.0f} tok/s per replica)")
    # a 37-row decode step with a 7,200-token cold prompt's chunk riding along (a mixed step)
    mixed = cost.iteration_time(plan((8192 - 37, 0), 37, prompt + 500))
    print(f"mixed step: 37 decodes + an 8,155-token chunk: {mixed * 1e3:.1f} ms")


class Drain:
    """Sends stage k+1 only once every request of stages <= k has completed (plus INTERVAL_S), as
    inference-perf's run_stage does; shifts that stage's arrival times by the wait."""

    def __init__(self, cluster, stage_of: list[int], starts: list[float]) -> None:
        self.cluster, self.stage_of, self.starts = cluster, stage_of, starts
        self.stage, self.sent, self.done, self.pending = 0, 0, 0, None
        self.by_stage: dict[int, list] = {}
        self.delta = [0.0] * len(starts)
        cluster._next_arrival = self.next_arrival
        for m in cluster.members:  # each member bound the cluster's on_release when it was made
            m._on_release = self.released(m._on_release)

    def released(self, original):
        def on_release(member, finished):
            original(member, finished)
            self.done += len(finished)
            if self.pending is not None and self.done == self.sent:
                self.open(max(s.completion_s for s in finished) + INTERVAL_S)
        return on_release

    def next_arrival(self) -> None:
        c = self.cluster
        if not self.by_stage:  # first call: the iterator holds every seq, in order
            seqs = list(c._arrivals)
            for s in seqs:
                self.by_stage.setdefault(self.stage_of[s.id], []).append(s)
            c._arrivals = iter(seqs)
        seq = next(c._arrivals, None)
        if seq is None:
            return
        if self.stage_of[seq.id] != self.stage and self.sent:
            self.pending = seq
            if self.done == self.sent:
                self.open(c.env.now + INTERVAL_S)
            return
        self.send(seq)

    def open(self, t: float) -> None:
        seq, self.pending = self.pending, None
        self.stage = k = self.stage_of[seq.id]
        self.delta[k] = max(t - self.starts[k], 0.0)
        for s in self.by_stage[k]:
            s.arrival_s += self.delta[k]
        self.send(seq)

    def send(self, seq) -> None:
        c = self.cluster
        self.sent += 1
        due = c.entry.due(seq.arrival_s, seq)
        at(c.env, due, lambda _: c._arrive(seq, due))


def drained(L, router: str, output: int, stages: list[tuple[float, float]]) -> dict:
    reqs, stage_of = L.requests(stages, output)
    starts = list(np.cumsum([0.0, L.WARMUP[1], *(sec for _, sec in stages)])[:-1])
    cluster = L.cluster_of(router)
    Drain(cluster, stage_of, starts)
    t0 = time.process_time()
    seqs = cluster.run(reqs)
    cpu = time.process_time() - t0
    sent = np.array([s.arrival_s for s in seqs])
    first = np.array([s.first_token_s for s in seqs])
    done = np.array([s.completion_s for s in seqs])
    out = np.array([s.output_tokens for s in seqs])
    stage = np.array(stage_of)
    ok = done - sent <= CLIENT_TIMEOUT_S
    rows = []
    for k in range(1, len(stages) + 1):
        m = stage == k
        span = done[m].max() - sent[m].min()
        achieved = m.sum() / (sent[m].max() - sent[m].min())  # inference-perf's achieved_rate
        rows.append((stages[k - 1][0], int(m.sum()), span, out[m].sum() / span, out[m & ok].sum() / span,
                     float(np.percentile((first - sent)[m], 90)), float(ok[m].mean()), achieved))
    ladder = stage > 0
    return {"router": router, "output": output, "rows": rows, "cpu": cpu,
            "tok_s": float(np.mean([r[3] for r in rows])), "tok_s_ok": float(np.mean([r[4] for r in rows])),
            "p90": float(np.percentile((first - sent)[ladder], 90)), "ok": float(ok[ladder].mean()),
            "wall_end": float(done.max())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default="random,prefix")
    p.add_argument("--output", default="1000,430")
    p.add_argument("--stages", type=int, default=0, help="the first N stages (0: all)")
    p.add_argument("--no-steps", action="store_true")
    args = p.parse_args()
    if not args.no_steps:
        steps()
    L = bench_module()
    stages = L.STAGES[:args.stages] if args.stages else L.STAGES
    for output in map(int, args.output.split(",")):
        for router in args.routers.split(","):
            r = drained(L, router, output, stages)
            print(f"\n{output} tokens, {router}: inference-perf tok/s {r['tok_s']:,.0f} (timeouts excluded "
                  f"{r['tok_s_ok']:,.0f}), P90 TTFT {r['p90']:.3g} s, within 300 s {r['ok']:.1%}, "
                  f"ends at {r['wall_end']:.0f} s, {r['cpu']:.0f} CPU s")
            print("QPS | requests | span s | tok/s | tok/s (ok) | P90 TTFT s | ok | achieved req/s | "
                  "tok/s / req/s")
            for q, n, span, a, b, t, ok, rate in r["rows"]:
                print(f"{q:g} | {n} | {span:.1f} | {a:,.0f} | {b:,.0f} | {t:.3g} | {ok:.0%} | {rate:.2f} | "
                      f"{a / rate:.0f}")
            sys.stdout.flush()


if __name__ == "__main__":
    main()
