"""Goodput (issue 10): `run --slo` reports the share of requests meeting per-request limits, and the goodput
search finds the highest rate meeting it, per GPU."""

from __future__ import annotations

import numpy as np

from simctl.results.slo import parse_slo
from simctl.serving.cluster_config import ClusterConfig
from simctl.sim.run import RunConfig, run
from simctl.studies.goodput import find_goodput, with_attainment
from simctl.traces.workload import Workload

CONFIG = RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=4.0, num_requests=100, seed=2))


def test_attainment_is_the_share_of_requests_meeting_every_limit() -> None:
    slo = parse_slo(["ttft=0.5,tpot=0.03"], 0.8)
    r = run(CONFIG, ClusterConfig(prefill_instances=1, decode_instances=1, kv_link_gbps=20.0))
    s = with_attainment(r.summary, r.result.requests, slo)
    q = r.result.requests
    ttft = q.first_token_s - q.arrival_s
    tpot = np.where(q.output_tokens > 1,
                    (q.completion_s - q.first_token_s) / (q.output_tokens - 1).clip(1), 0)
    share = float(((ttft <= 0.5) & (tpot <= 0.03)).mean())
    assert 0 < share < 1 and s["slo_attainment"] == share
    assert s["slo_met"] == (share >= 0.8 and s["sustainable"] and s["sched_delay_p50"] <= 2)


def test_goodput_is_the_highest_rate_meeting_the_slo_per_gpu() -> None:
    slo = parse_slo(["ttft=1,tpot=0.05"], 0.9)
    g = find_goodput(CONFIG, ClusterConfig(replicas=2, router="least-outstanding"), slo, start_qps=2.0)
    assert g.search.problem is None
    assert g.gpus == 2 and g.per_gpu == g.qps / 2
    met = [p["qps"] for p in g.search.probes if p["slo_met"]]
    missed = [p["qps"] for p in g.search.probes if not p["slo_met"]]
    assert g.qps == max(met) and min(missed) > g.qps
    assert all(p["slo_attainment"] >= 0.9 for p in g.search.probes if p["slo_met"])
