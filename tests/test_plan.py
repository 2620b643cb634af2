"""Issue 25: requests longer than the max model length refused and counted, settings compared from comma
lists, capacity as a sustainable rate, and `simctl plan`'s sizing arithmetic and bad-input lines."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.common.errors import InputError
from simctl.results.slo import SLO
from simctl.sim.run import RunConfig, run, trace_for
from simctl.studies.capacity import Capacity, CapacityResult
from simctl.studies.plan import (
    Candidate,
    Choice,
    best_reached,
    cost_per_million,
    final_key,
    link_gbps,
    rank_key,
    size,
)
from simctl.traces.request import Request
from simctl.traces.too_long import screen
from simctl.traces.workload import Workload


def _requests(*lengths: tuple[int, int]) -> list[Request]:
    return [Request(i, float(i), p, o) for i, (p, o) in enumerate(lengths)]


# ---- requests a server would refuse ------------------------------------------------------------------------
def test_refused_requests_are_counted_with_the_longest() -> None:
    s = screen(_requests((10, 5), (90, 20), (50, 50), (100, 1)), 100, "refuse")
    assert [r.id for r in s.requests] == [0, 2]  # 110 and 101 positions do not fit in 100
    assert (s.refused, s.truncated, s.longest) == (2, 0, 110)
    assert "2 of 4 requests exceed the max model length, 100" in s.note(100)


def test_truncate_cuts_the_prompt_and_refuses_an_output_too_long_alone() -> None:
    s = screen(_requests((90, 20), (5, 120), (10, 10)), 100, "truncate")
    assert [(r.id, r.prompt_tokens, r.output_tokens) for r in s.requests] == [(0, 80, 20), (2, 10, 10)]
    assert (s.refused, s.truncated) == (1, 1)


def test_error_mode_stops_in_one_line() -> None:
    with pytest.raises(InputError, match="request 1 needs 110 positions .* --max-model-len is 100"):
        screen(_requests((1, 1), (100, 10)), 100, "error")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(1, 300)), min_size=1, max_size=30),
       st.integers(2, 400), st.sampled_from(["refuse", "truncate"]))
def test_every_request_is_served_within_the_limit_or_counted(lengths: list[tuple[int, int]], limit: int,
                                                            mode: str) -> None:
    try:
        s = screen(_requests(*lengths), limit, mode)
    except InputError:  # nothing fits
        assert all(p + o > limit for p, o in lengths)
        return
    assert len(s.requests) + s.refused == len(lengths)
    assert all(r.prompt_tokens >= 1 and r.prompt_tokens + r.output_tokens <= limit for r in s.requests)


def test_llama2_on_sharegpt_runs_and_reports_the_refused() -> None:
    config = RunConfig(policy="sarathi", workload=Workload(trace="sharegpt", qps=2.0, num_requests=200),
                       model="llama-2-7b")
    long = sum(r.prompt_tokens + r.output_tokens > 4096 for r in trace_for(
        RunConfig(**{**config.__dict__, "max_model_len": 8192 * 4, "model": "mistral-7b"})).requests)
    r = run(config)
    assert long > 0 and r.summary["rejected"] == long
    assert r.summary["num_requests"] == 200 - long and r.summary["max_model_len"] == 4096
    assert any("refused" in w for w in r.summary["warnings"])


def test_a_run_whose_requests_fit_keeps_its_summary() -> None:
    r = run(RunConfig(policy="vllm", workload=Workload(trace="arxiv", qps=0.5, num_requests=50)))
    assert not {"rejected", "max_model_len", "on_too_long"} & set(r.summary)


def test_refused_requests_count_against_attainment() -> None:
    import pandas as pd

    frame = pd.DataFrame({"arrival_s": [0.0, 0.0], "first_token_s": [0.1, 5.0], "completion_s": [1.0, 6.0],
                          "output_tokens": [10, 10], "max_tbt_s": [0.1, 0.1]})
    slo = SLO(per_request={"ttft": 1.0})
    assert slo.attainment_of(frame) == 0.5
    assert slo.attainment_of(frame, refused=2) == 0.25  # 1 of 4 offered


# ---- capacity means sustainable ---------------------------------------------------------------------------
def test_a_backlogged_run_is_no_capacity_unless_the_paper_definition_is_asked() -> None:
    s = {"sustainable": True, "completed": 10, "num_requests": 10, "sched_delay_p50": 0.5,
         "saturation": "backlogged"}
    assert not SLO().met(s)
    assert SLO(definition="paper").met(s)
    with pytest.raises(InputError, match="--capacity-definition 'x'"):
        SLO(definition="x")


# ---- sizing ------------------------------------------------------------------------------------------------
def test_cost_per_million_tokens() -> None:
    # 6 GPUs at $2.50 an hour: $15/h = $0.0041667/s; at 1000 tokens/s, $4.1667 per million
    assert cost_per_million(2.5, 6, 1000.0) == pytest.approx(15 / 3600 / 1000 * 1e6)
    assert cost_per_million(2.5, 6, 1000.0) == pytest.approx(4.16667, rel=1e-5)


AT = {"throughput_tokens_per_s": 400.0, "throughput_rps": 2.0, "num_requests": 90, "rejected": 10,
      "tpot_p50": 0.05}


def _capacity(label: str, qps: float, tp: int) -> Capacity:
    probes = [{**AT, "qps": qps, "slo_met": True}, {**AT, "qps": qps * 1.1, "slo_met": False}]
    config = RunConfig(policy="sarathi", tp=tp)
    return Capacity("sarathi", "plan", SLO(), {0: CapacityResult(qps, probes)}, label, config)


def _sized(label: str, qps: float, tp: int, prices: dict[str, float] | None = None,
           split: tuple[int, int] | None = None) -> Choice | None:
    c = _capacity(label, qps, tp)
    assert c.config is not None
    return size(c, Candidate(c.config, label, split, 100.0 if split else None), 20.0, prices or {})


def test_sizing_a_candidate_by_hand() -> None:
    c = _sized("a", 3.0, 2, {"a100-80gb": 2.0})
    assert c.replicas == 7 and c.gpus == 14  # ceil(20 / 3) replicas of 2 GPUs
    assert c.qps_per_gpu == 1.5 and c.tokens_per_gpu == 200.0 and c.tokens_per_user == 20.0
    assert c.headroom == pytest.approx(7 * 3 / 20 - 1)
    # 20 QPS offered, 90% served, 200 output tokens each: 3600 tokens/s for 14 GPUs at $2/h
    assert c.served_tokens_per_s == pytest.approx(3600.0)
    assert c.cost_per_million_tokens == pytest.approx(2 * 14 / 3600 / 3600 * 1e6)


def test_the_fewest_gpus_win_then_the_cheapest() -> None:
    made = [_sized(label, qps, tp) for label, qps, tp in
            (("tp2", 7.0, 2), ("small", 2.0, 1), ("big", 4.0, 1))]
    assert [c.label for c in sorted(made, key=rank_key)] == ["big", "tp2", "small"]  # 5, 6, 10 GPUs
    assert _sized("none", 0.0, 1) is None


def test_choice_is_a_frozen_dataclass() -> None:
    c = _sized("a", 3.0, 1)
    assert isinstance(c, Choice) and c.price is None and c.cost_per_million_tokens is None


def test_a_disaggregated_unit_by_hand() -> None:
    c = _sized("pd", 11.0, 1, split=(1, 2))
    # a unit of 1 prefill and 2 decode instances is 3 GPUs; 20 QPS over 11 per unit: 2 units, 6 GPUs
    assert (c.candidate.gpus, c.replicas, c.gpus) == (3, 2, 6)
    assert c.qps_per_gpu == pytest.approx(11 / 3) and c.tokens_per_gpu == pytest.approx(400 / 3)
    assert c.headroom == pytest.approx(0.1)
    cc = c.candidate.cluster(2)
    assert (cc.prefill_instances, cc.decode_instances, cc.kv_link_gbps, cc.replicas) == (2, 4, 100.0, 1)
    assert c.candidate.cluster(1).router == "least-outstanding"
    assert _sized("co", 3.0, 2).candidate.cluster(3).replicas == 3
    assert link_gbps("a100-80gb") == pytest.approx(2400.0)  # NVLink: 300 GB/s each way


def test_checked_choices_rank_first_then_unchecked_then_failed() -> None:
    four, six, five = (replace(_sized(n, q, 1), checked=k) for n, q, k in
                       (("four", 5.0, False), ("six", 3.4, True), ("five", 4.0, None)))
    assert [c.label for c in sorted([four, six, five], key=final_key)] == ["six", "five", "four"]


def test_the_best_reached_on_the_gpus_allowed() -> None:
    made = [_sized("tp2", 7.0, 2), _sized("one", 4.0, 1), _sized("pd", 11.0, 1, split=(1, 2))]
    # on 5 GPUs: tp2 fits 2 replicas (14 QPS), one 5 (20 QPS), pd 1 unit (11 QPS)
    assert best_reached(made, 5) == "the best reaches 20 QPS (one, 5 x 1 GPUs, 4 QPS each)"
    assert best_reached(made[:1] + made[2:], 1) == "the smallest unit needs 2 GPUs"


# ---- comma lists -------------------------------------------------------------------------------------------
def test_a_grid_names_what_varies() -> None:
    from simctl.configs import Deployment
    from simctl.option_grid import grid

    combos = grid(RunConfig(), "vllm,sarathi", Deployment(model="mistral-7b", gpu="a100-80gb", tp="1,2"),
                  {"token_budget": [256, 512], "max_batch_size": None})
    assert [c.label for c in combos] == ["vllm tp=1", "vllm tp=2", "sarathi tp=1 token_budget=256",
                                         "sarathi tp=1 token_budget=512", "sarathi tp=2 token_budget=256",
                                         "sarathi tp=2 token_budget=512"]
    assert combos[2].config.options == {"token_budget": 256} and combos[1].config.tp == 2


# ---- one line for bad input, exit 2 ----------------------------------------------------------------------
def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    from simctl.cli import main

    with pytest.raises(SystemExit) as e:
        main(list(args))
    err = capsys.readouterr().err.strip()
    return e.value.code, err


PLAN = ("plan", "--model", "llama-2-7b", "--trace", "sharegpt", "--slo", "p99_tbt=0.1",
        "--num-requests", "100")


@pytest.mark.parametrize(("args", "words"), [
    (("run", "--token-budget", "256,x"), "--token-budget '256,x': 'x' is not an integer"),
    (("run", "--policy", "vllm", "--token-budget", "256,512"), "applies only to the policies sarathi"),
    (("capacity", "--gpu", "a100-80gb,h1000"), "unknown GPU 'h1000'"),
    (("capacity", "--tp", "1,x"), "--tp '1,x': comma-separated integers"),
    (("capacity", "--tp", "1,2"), "comparing models, GPUs or TP degrees needs --slo"),
    (("capacity", "--capacity-definition", "typical"), "--capacity-definition 'typical'"),
    (("run", "--on-too-long", "drop"), "--on-too-long 'drop': choose refuse, error, truncate"),
    (("run", "--max-model-len", "9000", "--model", "llama-2-7b"), "exceeds llama-2-7b's context of 4096"),
    (("run", "--trace", "sharegpt", "--model", "llama-2-7b", "--on-too-long", "error",
      "--num-requests", "50"),
     "but llama-2-7b has a context of 4096"),
    (("run", "--tp", "1,2", "--out", "x"), "--out writes one run"),
    ((*PLAN, "--rate", "20", "--gpu-cost", "h100=2"), "--gpu-cost h100: not a GPU searched (a100-80gb)"),
    ((*PLAN, "--rate", "20", "--gpu-cost", "a100-80gb"), "--gpu-cost 'a100-80gb': give GPU=PRICE"),
    ((*PLAN, "--rate", "0"), "--rate must be a finite number > 0"),
    ((*PLAN, "--rate", "20", "--token-budget", "1e3"), "'1e3' is not an integer"),
    ((*PLAN, "--rate", "20", "--pd-splits", "1:0"), "--pd-splits '1:0': give PREFILL:DECODE instances"),
    ((*PLAN, "--rate", "20", "--checks", "-1"), "--checks must be >= 0, got -1"),
    ((*PLAN, "--rate", "20", "--kv-link-gbps", "0"), "--kv-link-gbps must be a finite number > 0"),
    ((*PLAN, "--rate", "20", "--max-num-batched-tokens", "512,x"), "'x' is not an integer"),
])
def test_bad_input_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str], args: tuple[str, ...],
                                          words: str) -> None:
    code, err = _cli(capsys, *args)
    assert code == 2 and err.count("\n") == 0 and words in err, err


def test_a_rate_no_configuration_reaches_says_the_best(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _cli(capsys, *PLAN, "--rate", "1e6", "--policy", "sarathi", "--token-budget", "512",
                     "--max-gpus", "2", "--workers", "1", "--pd-splits", "none")
    assert code == 2 and err.count("\n") == 0
    assert "no configuration serves 1e+06 QPS within --max-gpus 2: the best reaches" in err
    assert "(sarathi, 2 x 1 GPUs," in err


def test_disaggregated_candidates_only_where_the_policy_can_serve_so() -> None:
    from simctl.configs import Deployment
    from simctl.plan_cmd import candidates, parse_splits

    found = candidates(RunConfig(), "sarathi,hf-padded", Deployment(), {"token_budget": [512]},
                       parse_splits("1:1,1:2"), None)
    assert [(c.label, c.split) for c in found] == [
        ("sarathi", None), ("hf-padded", None), ("sarathi P/D 1:1", (1, 1)), ("sarathi P/D 1:2", (1, 2))]
    assert found[2].kv_link_gbps == pytest.approx(2400.0) and found[2].config.options == {"token_budget": 512}
    assert parse_splits("none") == [] and len(candidates(RunConfig(), "vllm", Deployment(), {}, [],
                                                         5.0)) == 1


SERVED = {"max_num_batched_tokens": 512, "max_batch_size": 256, "block_size": 16, "enable_prefix_caching": 0,
          "long_prefill_token_threshold": 128}
FLAGS = ("--tensor-parallel-size 2 --max-num-batched-tokens 512 --max-num-seqs 256 --max-model-len 4096 "
         "--block-size 16 --gpu-memory-utilization 0.9 --no-enable-prefix-caching "
         "--long-prefill-token-threshold 128")


def test_a_vllm_v1_choice_as_vllm_serve_flags() -> None:
    from simctl.plan_cmd import serve_flags

    assert serve_flags(SERVED, RunConfig(policy="vllm-v1", model="llama-2-7b", tp=2)) == (FLAGS, "llama-2-7b")
    from simctl.costs.kv_capacity import KVSizing

    fp8 = RunConfig(policy="vllm-v1", model="llama-2-7b", tp=2,
                    kv_sizing=KVSizing(gpu_memory_utilization=0.8, dtype="fp8", kv_cache_dtype="fp8"))
    flags = serve_flags(SERVED, fp8)[0]
    assert "--gpu-memory-utilization 0.8 " in flags and "--quantization fp8 --kv-cache-dtype fp8" in flags


# ---- issue 35: the fewest GPUs a check passed; configurations that do not fit skipped ----------------------
def _checker(passes_at: dict[str, int]) -> tuple[list[list[str]], Callable[[list[Choice]], list[Choice]]]:
    """A check by hand: a choice passes once it has `passes_at[label]` replicas (0: never); the labels
    checked, batch by batch."""
    seen: list[list[str]] = []

    def check_batch(choices: list[Choice]) -> list[Choice]:
        seen.append([c.label for c in choices])
        return [replace(c, replicas=max(c.replicas, passes_at[c.label]), checked=True) if passes_at[c.label]
                else replace(c, checked=False) for c in choices]

    return seen, check_batch


def test_every_estimate_below_the_answer_is_checked_before_it_is_final() -> None:
    from simctl.studies.plan import select

    # 20 QPS: a 4.0 QPS replica is estimated at 5 GPUs, 3.4 at 6, 2.9 at 7
    made = [_sized(n, q, 1) for n, q in (("five-a", 4.0), ("five-b", 4.0), ("six", 3.4), ("seven", 2.9))]
    seen, check_batch = _checker({"five-a": 6, "five-b": 5, "six": 6, "seven": 7})
    ranked = select(made, 1, check_batch)
    # five-a needed a sixth replica: five-b, estimated at 5 GPUs, is checked and passes on 5
    assert seen == [["five-a"], ["five-b"]]
    assert [(c.label, c.gpus, c.checked) for c in ranked] == [
        ("five-b", 5, True), ("five-a", 6, True), ("six", 6, None), ("seven", 7, None)]
    # two at a time: the same answer; the two 5-GPU estimates checked side by side
    seen, check_batch = _checker({"five-a": 6, "five-b": 5, "six": 6, "seven": 7})
    assert select(made, 1, check_batch, batch=2)[0].label == "five-b" and seen == [["five-a", "five-b"]]


def test_checks_go_on_until_one_passes_and_zero_checks_none() -> None:
    from simctl.studies.plan import select

    made = [_sized(n, q, 1) for n, q in (("five", 4.0), ("six", 3.4), ("seven", 2.9))]
    seen, check_batch = _checker({"five": 0, "six": 0, "seven": 7})
    ranked = select(made, 1, check_batch)
    assert seen == [["five"], ["six"], ["seven"]] and ranked[0].label == "seven" and ranked[0].checked
    seen, check_batch = _checker({"five": 5, "six": 6, "seven": 7})
    assert select(made, 2, check_batch)[0].label == "five" and seen == [["five", "six"]]  # at least --checks
    seen, check_batch = _checker({"five": 5, "six": 6, "seven": 7})
    assert [c.checked for c in select(made, 0, check_batch)] == [None] * 3 and seen == []


def test_a_tp_degree_that_does_not_fit_is_skipped_with_its_reason() -> None:
    from simctl.studies.plan import fitting

    made = [Candidate(RunConfig(policy="sarathi", model="mixtral-8x7b", gpu="h100", tp=tp), f"tp={tp}")
            for tp in (1, 2)]
    fit, unfit = fitting(made)
    assert [c.label for c in fit] == ["tp=2"]
    ((reason, skipped),) = unfit.items()
    assert [c.label for c in skipped] == ["tp=1"]
    assert "mixtral-8x7b does not fit on h100 with tp=1: each GPU needs 89.0 GiB" in reason
    with pytest.raises(InputError, match="^none of the 1 configurations fits its GPUs: mixtral-8x7b"):
        fitting(made[:1])


def test_nothing_fitting_is_one_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    code, err = _cli(capsys, "plan", "--model", "mixtral-8x7b", "--gpu", "h100,a100-80gb", "--tp", "1",
                     "--policy", "vllm", "--pd-splits", "none", "--slo", "p99_tbt=0.1", "--rate", "5")
    assert code == 2 and err.count("\n") == 0
    assert "none of the 2 configurations fits its GPUs: mixtral-8x7b does not fit on h100 with tp=1" in err


def test_a_plan_goes_on_without_the_tp_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    from simctl.cli import main

    with pytest.raises(SystemExit) as e:
        main(["plan", "--model", "mixtral-8x7b", "--gpu", "h100", "--tp", "1,2", "--policy", "sarathi",
              "--token-budget", "512", "--pd-splits", "none", "--trace", "sharegpt", "--slo", "p99_tbt=0.1",
              "--rate", "2", "--num-requests", "100", "--workers", "1", "--checks", "1"])
    out = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert e.value.code in (0, None)
    assert "skipped 1 configuration (sarathi tp=1): mixtral-8x7b does not fit on h100 with tp=1" in out
    assert "searching 1 configurations" in out and "answer: sarathi tp=2" in out


def test_a_kv_cache_too_small_for_the_longest_request_is_skipped(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """Llama-2-13B on the placeholder CPU's roofline: 729 KV slots at --tp 2 (tests/test_misuse.py), more at
    --tp 4."""
    import simctl.costs.loader
    from simctl.studies.plan import fitting

    monkeypatch.setattr(simctl.costs.loader, "default_cost_path", lambda gpu: None)
    path = tmp_path / "long.csv"
    path.write_text("num_prefill_tokens,num_decode_tokens\n2000,10\n")
    made = [Candidate(RunConfig(policy="vllm", workload=Workload(trace=str(path), num_requests=1),
                                model="llama-2-13b", gpu="cpu", tp=tp), f"tp={tp}") for tp in (2, 4)]
    fit, unfit = fitting(made)
    assert [c.label for c in fit] == ["tp=4"]
    ((reason, skipped),) = unfit.items()
    assert [c.label for c in skipped] == ["tp=2"] and "needs 2010 tokens of KV cache" in reason
