"""End-to-end simulator cases computed by hand with `AffineCost`.

Every iteration costs  A + B x linear_tokens + C x sum(q x (c + q/2)) + D x decode_kv  where a prefill segment
of q new tokens attends to c cached ones and a decode row reads its cached tokens plus the one it adds.
Each test writes the arithmetic out; the simulator must reproduce it (both the decode-stretch fast path and
one iteration at a time), including the per-token times, read by hooking the policy (see `TokenClock`).
Then: overload and light load through `sim.run.run`, and `summarise_result`'s TBT percentiles against a
brute-force computation over every token.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import AffineCost, random_requests

from simctl.policies.base import Policy
from simctl.policies.registry import make_policy
from simctl.results.metrics import summarise_result
from simctl.results.run_result import SimResult
from simctl.sim.run import RunConfig, run
from simctl.sim.simulate import simulate
from simctl.traces.request import Request
from simctl.traces.workload import Workload

A, B, C, D = 0.01, 0.001, 1e-5, 1e-4  # overhead, per linear token, per attention unit, per KV token read
COST = AffineCost(overhead=A, per_token=B, per_attn=C, per_kv=D)
REL = 1e-12
# TBT percentiles come off a log-spaced histogram (20,000 bins a decade): the bin's centre is within
# 10 ** (0.5 / 20000) - 1 = 5.8e-5 of any gap in it
TBT_REL = 6e-5


def prefill(q: int, c: int = 0) -> float:
    """Attention units of a prefill segment of q new tokens on c cached ones."""
    return q * (c + q / 2)


class TokenClock:
    """Records every token's time by hooking a policy: before each `schedule()` (which the replica calls after
    every iteration) it reads each sequence's `last_token_s`. Needs fast=False, where an iteration samples at
    most one token per sequence; it checks that no token was missed."""

    def __init__(self, policy: Policy) -> None:
        self.seqs: list = []
        self.times: dict[int, list[float]] = {}
        add, schedule = policy.add, policy.schedule

        def hooked_add(seq) -> None:
            self.seqs.append(seq)
            self.times[seq.id] = []
            add(seq)

        def hooked_schedule():
            self.scan()
            return schedule()

        policy.add = hooked_add
        policy.schedule = hooked_schedule

    def scan(self) -> None:
        for s in self.seqs:
            t = self.times[s.id]
            if s.generated > len(t):
                t.append(s.last_token_s)
            assert len(t) == s.generated, f"request {s.id} sampled two tokens between looks"

    def gaps(self, rid: int) -> list[float]:
        return list(np.diff(self.times[rid]))


def sim_both(name: str, reqs: list[Request], capacity: int = 4096, max_seq_len: int = 256,
             **kw) -> tuple[SimResult, TokenClock]:
    """Run stepping one iteration at a time (with per-token times) and with the fast path; the request
    records must agree. Returns the stepped run."""
    step_policy = make_policy(name, capacity, max_seq_len, kw)
    clock = TokenClock(step_policy)
    step = simulate(reqs, step_policy, COST, fast=False)
    clock.scan()
    fast = simulate(reqs, make_policy(name, capacity, max_seq_len, kw), COST, fast=True)
    for col in ("first_scheduled_s", "first_token_s", "completion_s", "generated_tokens", "preemptions"):
        np.testing.assert_allclose(fast.requests[col], step.requests[col], rtol=1e-12, atol=0, err_msg=col)
    return step, clock


def row(res: SimResult, rid: int) -> dict:
    return res.requests.set_index("request_id").loc[rid].to_dict()


# --------------------------------------------------------------------------------------------------------


def test_vllm_single_request() -> None:
    res, clock = sim_both("vllm", [Request(0, 0.0, 10, 3)])
    t1 = A + 10 * B + C * prefill(10)  # prefill: 10 linear tokens, 10 x (0 + 5) = 50 attention units
    t2 = A + 1 * B + D * 11  # decode of token 1: reads the 10 prompt tokens + itself
    t3 = A + 1 * B + D * 12  # decode of token 2: 12 KV tokens
    assert t1 == pytest.approx(0.01 + 0.010 + 0.0005, rel=REL)
    assert t2 == pytest.approx(0.01 + 0.001 + 0.0011, rel=REL)
    assert t3 == pytest.approx(0.01 + 0.001 + 0.0012, rel=REL)
    r = row(res, 0)
    assert r["first_scheduled_s"] == 0.0
    assert r["first_token_s"] == pytest.approx(t1, rel=REL)  # TTFT (arrival at 0)
    assert r["completion_s"] == pytest.approx(t1 + t2 + t3, rel=REL)  # E2E
    assert clock.gaps(0) == pytest.approx([t2, t3], rel=REL)  # TBT
    s = summarise_result(res)
    assert s["ttft_p50"] == pytest.approx(t1, rel=REL)
    assert s["e2e_p50"] == pytest.approx(t1 + t2 + t3, rel=REL)
    assert s["tpot_p50"] == pytest.approx((t2 + t3) / 2, rel=REL)
    assert s["tbt_p50"] == pytest.approx(t2, rel=TBT_REL)  # inverted CDF of {t2, t3}: 50% -> t2
    assert s["tbt_p99"] == pytest.approx(t3, rel=TBT_REL)
    its = res.iterations.frame()
    assert list(its["prefill_tokens"]) == [10, 0, 0]
    assert list(its["decode_tokens"]) == [0, 1, 1]
    assert list(its["kv_used_tokens"]) == [16, 16, 16]  # one block of 16 holds all 12 tokens


def test_sarathi_chunks_a_prompt_to_the_budget() -> None:
    res, clock = sim_both("sarathi", [Request(0, 0.0, 10, 2)], token_budget=4)
    t1 = A + 4 * B + C * prefill(4, 0)  # chunk 1: 4 x (0 + 2) = 8 units; samples nothing (no LM head
    t2 = A + 4 * B + C * prefill(4, 4)  # chunk 2: 4 x (4 + 2) = 24 units          in AffineCost anyway)
    t3 = A + 2 * B + C * prefill(2, 8)  # chunk 3: 2 x (8 + 1) = 18 units; reaches the prompt's end: token 1
    t4 = A + 1 * B + D * 11  # decode: 10 cached + 1
    assert (prefill(4, 0), prefill(4, 4), prefill(2, 8)) == (8, 24, 18)
    r = row(res, 0)
    assert r["first_token_s"] == pytest.approx(t1 + t2 + t3, rel=REL)  # TTFT after the third chunk
    assert r["first_token_s"] == pytest.approx(3 * A + 10 * B + 50 * C, rel=REL)
    assert r["completion_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert clock.gaps(0) == pytest.approx([t4], rel=REL)
    its = res.iterations.frame()
    assert list(its["prefill_tokens"]) == [4, 4, 2, 0]
    assert list(its["decode_tokens"]) == [0, 0, 0, 1]
    assert its["duration_s"].tolist() == pytest.approx([t1, t2, t3, t4], rel=REL)


def test_sarathi_coalesces_chunks_with_the_running_decode() -> None:
    # A (P=2, O=4) decodes; B (P=6, O=1) arrives during A's first decode. With budget 4, A's decode takes 1
    # token of each iteration and B's prompt goes in chunks of the 3 left: 3 + 3, never stalling A.
    t1 = A + 2 * B + C * prefill(2)  # A's prefill: 2 x 1 = 2 units
    t2 = A + B + D * 3  # A's decode 1: 2 + 1 KV tokens
    arrive_b = t1 + t2 / 2
    res, clock = sim_both("sarathi", [Request(0, 0.0, 2, 4), Request(1, arrive_b, 6, 1)], token_budget=4)
    t3 = A + (1 + 3) * B + C * prefill(3, 0) + D * 4  # A's decode 2 (3 + 1 KV) + B's chunk 1: 3 x 1.5
    t4 = A + (1 + 3) * B + C * prefill(3, 3) + D * 5  # A's decode 3 (4 + 1 KV) + B's chunk 2: 3 x (3 + 1.5)
    assert (prefill(3, 0), prefill(3, 3)) == (4.5, 13.5)
    assert row(res, 0)["completion_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert row(res, 1)["first_scheduled_s"] == pytest.approx(t1 + t2, rel=REL)
    assert row(res, 1)["first_token_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert clock.gaps(0) == pytest.approx([t2, t3, t4], rel=REL)  # no stall: one iteration per token
    its = res.iterations.frame()
    assert list(its["prefill_tokens"]) == [2, 0, 3, 3]
    assert list(its["decode_tokens"]) == [0, 1, 1, 1]
    assert its["duration_s"].tolist() == pytest.approx([t1, t2, t3, t4], rel=REL)


def test_faster_transformer_padded_batch() -> None:
    # X (P=5, O=2) and Y (P=9, O=4) arrive together; Z (P=3, O=1) arrives while their batch runs and waits
    t1 = A + (2 * 9) * B + C * 2 * prefill(9)  # padded prefill: 2 rows x 9 = 18 linear tokens, 2 x 40.5 units
    t2 = A + 2 * B + D * 2 * 10  # decode 1: 2 rows x 10 KV columns (X's row padded to 9 + 1)
    t3 = A + 2 * B + D * 2 * 11  # decode 2: X finished, its row stays: still 2 rows, 2 x 11 columns
    t4 = A + 2 * B + D * 2 * 12  # decode 3: 2 x 12
    t5 = A + 3 * B + C * prefill(3)  # Z's batch of one: 3 linear tokens, 3 x 1.5 units
    assert t1 == pytest.approx(0.01 + 0.018 + 0.00081, rel=REL)
    res, clock = sim_both("faster-transformer", [Request(0, 0.0, 5, 2), Request(1, 0.0, 9, 4),
                                                 Request(2, 0.001, 3, 1)], capacity=4096, max_seq_len=64)
    x, y, z = row(res, 0), row(res, 1), row(res, 2)
    assert x["first_token_s"] == pytest.approx(t1, rel=REL)
    assert y["first_token_s"] == pytest.approx(t1, rel=REL)
    assert x["completion_s"] == pytest.approx(t1 + t2, rel=REL)
    assert y["completion_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert z["first_scheduled_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)  # only once the batch is done
    assert z["completion_s"] == pytest.approx(t1 + t2 + t3 + t4 + t5, rel=REL)
    assert clock.gaps(1) == pytest.approx([t2, t3, t4], rel=REL)
    its = res.iterations.frame()
    assert list(its["linear_tokens"]) == [18, 2, 2, 2, 3]  # decode rows stay 2 after X finishes
    assert list(its["decode_tokens"]) == [0, 2, 1, 1, 0]
    assert list(its["prefill_tokens"]) == [14, 0, 0, 0, 3]  # real prompt tokens: 5 + 9, then 3
    assert list(its["kv_used_tokens"]) == [128, 128, 128, 128, 64]  # max_seq_len 64 reserved per request


def test_vllm_generation_stall() -> None:
    # A (P=8, O=5) decodes; B (P=6, O=2) arrives during A's first decode. vLLM runs B's prefill alone next:
    # A's token 3 waits for that prefill iteration and then the joint decode iteration.
    t1 = A + 8 * B + C * prefill(8)  # A's prefill: 8 x 4 = 32 units -> 0.01832
    t2 = A + B + D * 9  # A's decode 1 (9 KV) -> 0.0119
    arrive_b = 0.025
    assert t1 < arrive_b < t1 + t2  # 0.01832 < 0.025 < 0.03022
    t3 = A + 6 * B + C * prefill(6)  # B's prefill alone: 6 x 3 = 18 units -> 0.01618
    t4 = A + 2 * B + D * (10 + 7)  # A (9 cached + 1) and B (6 + 1) decode together -> 0.0137
    t5 = A + B + D * 11  # A alone
    t6 = A + B + D * 12
    res, clock = sim_both("vllm", [Request(0, 0.0, 8, 5), Request(1, arrive_b, 6, 2)])
    a, b = row(res, 0), row(res, 1)
    assert a["first_token_s"] == pytest.approx(t1, rel=REL)
    assert b["first_scheduled_s"] == pytest.approx(t1 + t2, rel=REL)
    assert b["first_token_s"] == pytest.approx(t1 + t2 + t3, rel=REL)
    assert b["completion_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert a["completion_s"] == pytest.approx(t1 + t2 + t3 + t4 + t5 + t6, rel=REL)
    stall = t3 + t4  # the prefill iteration + A's decode iteration
    assert clock.gaps(0) == pytest.approx([t2, stall, t5, t6], rel=REL)
    assert stall == pytest.approx(0.01618 + 0.0137, rel=REL)
    its = res.iterations.frame()
    assert list(its["prefill_tokens"]) == [8, 0, 6, 0, 0, 0]
    assert list(its["decode_tokens"]) == [0, 1, 0, 2, 1, 1]
    # pooled gaps {t2 .0119, t5 .0121, t6 .0122, t4 .0137 (B), stall .02988}: P50 is the 3rd, P99 the stall
    s = summarise_result(res)
    assert s["tbt_p50"] == pytest.approx(t6, rel=TBT_REL)
    assert s["tbt_p99"] == pytest.approx(stall, rel=TBT_REL)


def test_orca_hybrid_iteration() -> None:
    # A (P=8, O=4) decodes; B (P=6, O=2) arrives during A's first decode; Orca runs B's whole prefill in the
    # same iteration as A's next decode.
    t1 = A + 8 * B + C * prefill(8)  # 0.01832
    t2 = A + B + D * 9  # 0.0119
    arrive_b = 0.025
    t3 = A + (6 + 1) * B + C * prefill(6) + D * 10  # hybrid: 7 linear tokens, 18 units, A reads 9 + 1
    t4 = A + 2 * B + D * (11 + 7)  # both decode: A 10 + 1, B 6 + 1
    assert t3 == pytest.approx(0.01 + 0.007 + 0.00018 + 0.001, rel=REL)
    res, clock = sim_both("orca", [Request(0, 0.0, 8, 4), Request(1, arrive_b, 6, 2)], max_seq_len=32)
    a, b = row(res, 0), row(res, 1)
    assert b["first_scheduled_s"] == pytest.approx(t1 + t2, rel=REL)
    assert b["first_token_s"] == pytest.approx(t1 + t2 + t3, rel=REL)
    assert a["completion_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert b["completion_s"] == pytest.approx(t1 + t2 + t3 + t4, rel=REL)
    assert clock.gaps(0) == pytest.approx([t2, t3, t4], rel=REL)
    its = res.iterations.frame()
    assert its["duration_s"].tolist() == pytest.approx([t1, t2, t3, t4], rel=REL)
    assert list(its["prefill_tokens"]) == [8, 0, 6, 0]
    assert list(its["decode_tokens"]) == [0, 1, 1, 2]
    assert list(its["batch_size"]) == [1, 1, 2, 2]


def test_vllm_preemption_by_recompute() -> None:
    # 32 KV slots (2 blocks of 16, no watermark). X (P=15, O=3) and Y (P=15, O=4) arrive together: both
    # prompts fit a block each. Decode 1 caches slot 16 of each: fits. Decode 2 needs a 17th slot for each:
    # X (oldest) finds no free block, so Y (newest) is preempted, X grows into Y's block and decodes alone.
    # X finishes, Y is re-prefilled (prompt + its 2 tokens) and decodes its 4th token.
    t1 = A + 30 * B + C * 2 * prefill(15)  # both prefills packed: 30 tokens, 2 x 15 x 7.5 units
    t2 = A + 2 * B + D * 2 * 16  # both decode: 15 + 1 each
    t3 = A + B + D * 17  # X alone: 16 + 1; X is done (3 tokens)
    t4 = A + 17 * B + C * prefill(17)  # Y recomputes prompt + its 2 tokens: 17 x 8.5 units; samples token 3
    t5 = A + B + D * 18  # Y's last decode: 17 + 1
    res, clock = sim_both("vllm", [Request(0, 0.0, 15, 3), Request(1, 0.0, 15, 4)], capacity=32,
                          max_seq_len=32)
    x, y = row(res, 0), row(res, 1)
    assert (x["preemptions"], y["preemptions"]) == (0, 1)
    assert x["completion_s"] == pytest.approx(t1 + t2 + t3, rel=REL)
    assert y["completion_s"] == pytest.approx(t1 + t2 + t3 + t4 + t5, rel=REL)
    assert clock.gaps(1) == pytest.approx([t2, t3 + t4, t5], rel=REL)
    its = res.iterations.frame()
    assert list(its["prefill_tokens"]) == [30, 0, 0, 17, 0]
    assert list(its["decode_tokens"]) == [0, 2, 1, 0, 1]


# --------------------------------------------------------------------------------------------------------


def test_overload_is_unsustainable_and_light_load_is_not() -> None:
    heavy = run(RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=50,
                                                           num_requests=2000))).summary
    assert heavy["sustainable"] is False
    assert heavy["completed"] < heavy["num_requests"]
    light = run(RunConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=0.5,
                                                           num_requests=2000))).summary
    assert light["sustainable"] is True
    assert light["completed"] == light["num_requests"] == 2000
    assert light["preemptions"] == 0


@pytest.mark.parametrize("name", ["vllm", "sarathi", "orca", "faster-transformer"])
def test_tbt_percentiles_match_brute_force(name: str) -> None:
    reqs = random_requests(30, qps=6.0, seed=11, max_prompt=300, max_output=60)
    capacity = 1024 if name in ("vllm", "sarathi") else 4 * 400  # small: the paged policies preempt
    res, clock = sim_both(name, reqs, capacity=capacity, max_seq_len=400)
    for r in reqs:
        assert len(clock.times[r.id]) == r.output_tokens
    gaps = np.concatenate([np.diff(clock.times[r.id]) for r in reqs])
    assert len(gaps) == sum(r.output_tokens - 1 for r in reqs)
    s = summarise_result(res)
    for p in (50, 90, 99):
        exact = float(np.percentile(gaps, p, method="inverted_cdf"))
        assert s[f"tbt_p{p}"] == pytest.approx(exact, rel=TBT_REL), p
        # and no other gap is a better match: the right order statistic was picked
        nearest = gaps[np.argmin(np.abs(gaps - s[f"tbt_p{p}"]))]
        assert nearest == pytest.approx(exact, rel=2 * TBT_REL), p
    # the request-level metrics from the same per-token times
    first = np.array([clock.times[r.id][0] for r in reqs])
    last = np.array([clock.times[r.id][-1] for r in reqs])
    arrival = np.array([r.arrival_s for r in reqs])
    assert s["ttft_p90"] == pytest.approx(float(np.percentile(first - arrival, 90)), rel=1e-12)
    assert s["e2e_p50"] == pytest.approx(float(np.percentile(last - arrival, 50)), rel=1e-12)
    if name in ("vllm", "sarathi"):
        assert s["preemptions"] > 0  # the gaps include recompute stalls


@pytest.mark.parametrize("name", ["vllm", "sarathi", "faster-transformer"])
def test_scaled_cost_scales_every_time_when_all_arrive_at_once(name: str) -> None:
    """ScaledCost(base, 2): with every request arriving at 0 no decision depends on the clock, so the same
    iterations run and every timestamp doubles (decode stretches included)."""
    from simctl.costs.base import ScaledCost

    requests = [Request(i, 0.0, r.prompt_tokens, r.output_tokens)
                for i, r in enumerate(random_requests(40, 1.0, seed=3, max_prompt=600, max_output=60))]
    base = AffineCost()
    runs = [simulate(requests, make_policy(name, 20_000, 4096), cost)
            for cost in (base, ScaledCost(base, 2.0))]
    a, b = (r.requests.sort_values("request_id").reset_index(drop=True) for r in runs)
    for col in ("first_token_s", "completion_s"):
        assert np.allclose(b[col], 2.0 * a[col], rtol=1e-9)
    ia, ib = (r.iterations.frame() for r in runs)
    assert ia["count"].sum() == ib["count"].sum() > len(requests)
    assert np.allclose(ib["duration_s"], 2.0 * ia["duration_s"], rtol=1e-9)
