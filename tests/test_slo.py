"""SLOs: the --slo grammar, met() on hand-made summaries, per-request attainment on a hand-made requests
table, Sarathi-Serve's Table 3 defaults priced by hand on the roofline, and capacities over seeds."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from simctl.common.errors import InputError
from simctl.costs.roofline import Roofline
from simctl.results.slo import SLO, parse_slo, table3_decode_time, table3_slos
from simctl.sim.run import RunConfig
from simctl.studies.capacity import Capacity, CapacityResult, probe_summary
from simctl.traces.workload import Workload


def test_parse_combines_items_and_repeats() -> None:
    slo = parse_slo(["p99_tbt=0.1", "p50_ttft=2, ttft=3,tpot=0.05", "p90_e2e=1e1"], None, 1.5)
    assert slo == SLO({"p99_tbt": 0.1, "p50_ttft": 2.0, "p90_e2e": 10.0}, {"ttft": 3.0, "tpot": 0.05}, 0.9,
                      1.5)
    assert parse_slo(["tbt=0.2"], 0.99).attainment == 0.99
    assert parse_slo([]) == SLO()


@pytest.mark.parametrize(("values", "attainment", "needle"), [
    (["p95_tbt=1"], None, "unknown key 'p95_tbt'"),
    (["p99_itl=1"], None, "unknown key"),
    (["p99_tbt"], None, "key=seconds"),
    (["p99_tbt="], None, "key=seconds"),
    (["=1"], None, "key=seconds"),
    (["p99_tbt=0.1,"], None, "key=seconds"),
    (["p99_tbt=fast"], None, "not a number"),
    (["p99_tbt=0"], None, "positive, finite"),
    (["ttft=-2"], None, "positive, finite"),
    (["e2e=inf"], None, "positive, finite"),
    (["p50_ttft=nan"], None, "positive, finite"),
    (["p99_tbt=0.1", "p99_tbt=0.2"], None, "given twice"),
    (["p99_tbt=0.1"], 0.9, "--attainment applies to per-request"),
    (["ttft=1"], 0.0, "--attainment"),
    (["ttft=1"], 1.01, "--attainment"),
])
def test_parse_refuses(values: list[str], attainment: float | None, needle: str) -> None:
    with pytest.raises(InputError, match=None) as e:
        parse_slo(values, attainment)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_sched_delay_limit_is_checked() -> None:
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(InputError, match="--max-sched-delay-p50"):
            parse_slo([], None, bad)


def _summary(**kw: object) -> dict:
    s = {"sustainable": True, "completed": 10, "num_requests": 10, "sched_delay_p50": 1.0, "tbt_p99": 0.1,
         "ttft_p50": 2.0, "tpot_p90": 0.05, "e2e_p99": None}
    return {**s, **kw}


def test_met_by_hand() -> None:
    slo = SLO({"p99_tbt": 0.1, "p50_ttft": 2.0})
    assert slo.met(_summary())  # limits are inclusive
    assert not slo.met(_summary(tbt_p99=0.1000001))
    assert not slo.met(_summary(ttft_p50=2.5))
    assert not slo.met(_summary(sched_delay_p50=2.01))  # the default 2 s scheduling-delay rule
    assert not slo.met(_summary(sched_delay_p50=None))
    assert not slo.met(_summary(sustainable=False))
    assert not slo.met(_summary(completed=9))
    assert not SLO({"p99_e2e": 5.0}).met(_summary())  # no value (no request finished): not met
    assert SLO({"p90_tpot": 0.05}, sched_delay_p50_s=1.0).met(_summary())
    per_request = SLO(per_request={"ttft": 1.0}, attainment=0.8)
    assert per_request.met(_summary(slo_attainment=0.8))
    assert not per_request.met(_summary(slo_attainment=0.79))
    with pytest.raises(ValueError, match="slo_attainment"):
        per_request.met(_summary())


def test_attainment_by_hand() -> None:
    # request 0: ttft 1, e2e 3, tpot 1, longest gap 1.5; request 1: one token (no TPOT, no gap);
    # request 2: ttft 0.5, e2e 10.5, tpot 2.5, longest gap 4; request 3 never finished
    req = pd.DataFrame({"arrival_s": [0.0, 1.0, 2.0, 3.0], "first_token_s": [1.0, 1.2, 2.5, 4.0],
                        "completion_s": [3.0, 1.2, 12.5, -1.0], "output_tokens": [3, 1, 5, 4],
                        "max_tbt_s": [1.5, 0.0, 4.0, 0.0]})
    assert SLO().attainment_of(req) == 0.75  # only "finished" applies
    assert SLO(per_request={"ttft": 0.5}).attainment_of(req) == 0.5  # requests 1 and 2
    assert SLO(per_request={"tpot": 1.0}).attainment_of(req) == 0.5  # 0 and 1
    assert SLO(per_request={"tbt": 1.5}).attainment_of(req) == 0.5  # 0 and 1
    assert SLO(per_request={"e2e": 3.0, "ttft": 1.0}).attainment_of(req) == 0.5  # 0 and 1
    assert SLO(per_request={"e2e": 10.5, "tbt": 4.0}).attainment_of(req) == 0.75
    assert SLO(per_request={"ttft": 0.1}).attainment_of(req) == 0.0


def test_attainment_of_a_simulated_run_matches_its_records() -> None:
    config = RunConfig(policy="sarathi", workload=Workload(trace="sharegpt", num_requests=100, qps=2.0))
    s = probe_summary(config, SLO(per_request={"tbt": 0.06, "ttft": 0.5}))
    s_loose = probe_summary(config, SLO(per_request={"tbt": 1e3, "ttft": 1e3}))
    assert 0 < s["slo_attainment"] < 1 and s_loose["slo_attainment"] == 1.0
    assert "slo_attainment" not in probe_summary(config, SLO({"p99_tbt": 0.1}))


def test_describe() -> None:
    slo = SLO({"p99_tbt": 0.1, "p50_ttft": 2.0}, {"ttft": 3.0, "tbt": 0.25}, 0.95, 1.5)
    assert slo.describe() == ("P99 TBT <= 0.1 s, P50 TTFT <= 2 s, TTFT <= 3 s and TBT <= 0.25 s for >= 95% "
                              "of requests, P50 scheduling delay <= 1.5 s, sustainable, not backlogged")


def test_dict_round_trip_and_older_validations() -> None:
    slo = SLO({"p99_tbt": 0.1}, {"e2e": 9.0}, 0.5, 3.0)
    assert SLO.from_dict(slo.to_dict()) == slo
    old = {"tbt_p99_s": 0.5, "sched_delay_p50_s": 2.0, "ttft_p50_s": None}  # validation.json before --slo
    assert SLO.from_dict(old) == SLO({"p99_tbt": 0.5})


def test_table3_defaults_priced_by_hand_on_the_roofline() -> None:
    """Mistral-7B on an A100 (312 TFLOP/s, 2039 GB/s) at the catalogue's measured efficiencies (mfu 0.757, mbu
    0.819, 6.9 us per GEMM) and the host's cuda-graph defaults (18.1 us for each of 32 layers, 0.118 ms for
    each of 32 requests): 32 decode rows (under one tile) each reading 4,097 tokens of KV."""
    layer = 4096 * (32 + 2 * 8) * 128 + 32 * 128 * 4096 + 3 * 4096 * 14336  # QKV + O + SwiGLU
    linear, head = 32 * layer, 32000 * 4096
    flops, bw, gemm = 312e12 * 0.757, 2039e9 * 0.819, 6.9e-6
    kv_per_token = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads of 128, 2 bytes
    want = (32 * 18.1e-6 + 32 * 0.118e-3
            + math.hypot(2 * linear * 32 / flops, 2 * linear / bw) + 4 * 32 * gemm
            + math.hypot(2 * head * 32 / flops, 2 * head / bw) + gemm + 32 * 4097 * kv_per_token / bw)
    roofline = Roofline("mistral-7b", "a100-80gb")
    assert table3_decode_time(roofline) == pytest.approx(want, rel=1e-12)
    slos = table3_slos(roofline)
    assert slos["strict"] == SLO({"p99_tbt": 5 * table3_decode_time(roofline)})
    assert slos["relaxed"] == SLO({"p99_tbt": 25 * table3_decode_time(roofline)})
    # the paper's Mistral-7B / A100 limits are 0.1 s and 0.5 s; the roofline's decode is 21% above theirs
    # since its host terms were fitted to vLLM 0.11 (issue 39: 4.4 ms for this step; within 15% at 2 ms)
    assert slos["strict"].percentiles["p99_tbt"] == pytest.approx(0.1, rel=0.25)


def test_capacity_over_seeds_is_the_lower_median() -> None:
    def search(qps: float, met_above: bool = True) -> CapacityResult:
        probes = [{"qps": qps, "slo_met": True}, {"qps": 2 * qps, "slo_met": False}] if met_above else []
        return CapacityResult(qps, probes)

    cap = Capacity("vllm", "strict", SLO(), {0: search(3.0), 1: search(1.0), 2: search(2.0), 3: search(5.0)})
    assert (cap.qps, cap.qps_min, cap.qps_max) == (2.0, 1.0, 5.0)
    assert cap.median_search is cap.searches[2] and cap.problems == {}
    assert [p["slo"] for p in cap.probes] == ["strict"] * 8
    assert np.isclose(Capacity("vllm", "x", SLO(), {7: search(4.0)}).qps, 4.0)


def test_misses_name_each_limit_missed() -> None:
    slo = SLO({"p99_tbt": 0.1, "p50_ttft": 2.0}, {"ttft": 1.0})
    assert slo.misses(_summary(slo_attainment=0.9)) == []
    assert slo.misses(_summary(tbt_p99=0.2, sched_delay_p50=3.0, slo_attainment=0.5)) == [
        "sched_delay_p50", "p99_tbt", "attainment"]
    assert slo.misses(_summary(sustainable=False, tbt_p99=0.2)) == ["sustainable"]  # unsustainable says all
    assert slo.misses(_summary(saturation="backlogged", slo_attainment=1.0)) == ["backlogged"]
    assert slo.misses(_summary(saturation="too short to judge", slo_attainment=1.0)) == ["too short"]
    assert SLO(definition="paper").misses(_summary(saturation="too short to judge")) == []


def test_what_bound_a_capacity() -> None:
    """The limits missed by the lowest probe above the capacity (issue 35: strict and relaxed both 3.44)."""
    slo = SLO({"p99_tbt": 0.1})

    def probe(qps: float) -> dict:
        return _summary(tbt_p99=0.05 * qps, sched_delay_p50=1.0 if qps < 3 else 2.5)

    from simctl.studies.capacity import search_qps
    result = search_qps(probe, slo, start_qps=1.0)
    assert 1.9 < result.qps <= 2.0 and result.bound_by == ["p99_tbt"]
    assert search_qps(lambda q: _summary(sched_delay_p50=q), slo).bound_by == ["sched_delay_p50"]
    assert CapacityResult(1.0, [{"qps": 1.0, "slo_met": True}]).bound_by == []  # nothing probed above


def test_limits_with_units() -> None:
    """Issue 35: --slo took seconds and --goodput milliseconds in one command; a unit now reads the same in
    both, and a plain number keeps its option's unit."""
    from simctl.results.vllm_bench import parse_goodput

    assert parse_slo(["p99_tbt=100ms,ttft=2s,tpot=0.05"]) == SLO({"p99_tbt": 0.1},
                                                                 {"ttft": 2.0, "tpot": 0.05})
    assert parse_goodput(["ttft:0.5s,tpot:50ms,e2el:2000"]).limits_ms == {"ttft": 500.0, "tpot": 50.0,
                                                                          "e2el": 2000.0}
    assert parse_goodput(["ttft:100ms"]).slo() == parse_slo(["ttft=100ms"])
    for bad, option in ((["p99_tbt=fast"], parse_slo), (["p99_tbt=ms"], parse_slo),
                        (["ttft:5h"], parse_goodput)):
        with pytest.raises(InputError, match="is not a number"):
            option(bad)
    with pytest.raises(InputError, match="positive"):
        parse_slo(["p99_tbt=-5ms"])
