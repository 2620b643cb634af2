"""A vLLM profile's request stream (`profiler/vllm_stream.py`) and the per-request host terms it fits
(`simctl.costs.overheads.StepOverheads.new_request_s`, `new_request_token_s`), checked by hand."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from simctl.common.errors import InputError
from simctl.costs.base import CostModel
from simctl.costs.fitted import Fitted
from simctl.costs.overheads import StepOverheads
from simctl.policies.plan import BatchPlan, hybrid
from simctl.policies.seq import Seq
from simctl.profiler.vllm_served import calibrate, decode_plan
from simctl.profiler.vllm_stream import StreamStep, fit_stream, stream_steps
from simctl.traces.request import Request

SHIPPED = Path(__file__).resolve().parents[1] / "simctl" / "profiler" / "profiles" / "cpu" / "cost_model.json"


class PerRow(CostModel):
    """1 ms per scheduled request."""

    def iteration_time(self, plan: BatchPlan) -> float:
        return 1e-3 * len(plan.seqs)


def _run(ends: list[float], counts: list[tuple[int, int]], members: list[list[tuple[int, int]]],
         arrivals: list[float]) -> SimpleNamespace:
    """A served run's records as `stream_steps` reads them: rows ending at `ends`, with (prefill, decode)
    token counts, each step's members, and requests (prompt 10 + id) arriving at `arrivals`."""
    frame = pd.DataFrame({"start_s": np.array(ends) - 1e-4, "duration_s": 1e-4,
                          "prefill_tokens": [p for p, _ in counts], "decode_tokens": [d for _, d in counts]})
    requests = [Request(i, t, 10 + i, 5) for i, t in enumerate(arrivals)]
    return SimpleNamespace(result=SimpleNamespace(iterations=SimpleNamespace(frame=lambda: frame)),
                           members=members, requests=requests)


def test_a_step_counts_when_it_continues_a_busy_engine_and_adds_up() -> None:
    # requests 0 (prompt 10) at 0, 1 (prompt 11) at 0.0015, 2 (prompt 12) at 0.0105
    run = _run([0.001, 0.003, 0.006, 0.020, 0.022],
               [(10, 0), (11, 1), (0, 2), (12, 0), (0, 1)],
               [[(0, 0)], [(1, 0), (0, 1)], [(0, 2), (1, 1)], [(2, 0)], [(2, 1)]],
               [0.0, 0.0015, 0.0105])
    steps, dropped = stream_steps(run, {r.id: r.prompt_tokens for r in run.requests})
    # step 0 has no previous step (not counted either way), step 3 decodes nothing (idle before it)
    assert dropped == 1
    a, b, c = steps
    assert (a.period_s, a.decode_contexts, a.prefills, a.new, a.arrivals) == (
        pytest.approx(0.002), (10,), (11,), 1, 1)  # request 0 decodes its token 1 on 10 computed
    assert (b.decode_contexts, b.prefills, b.new, b.arrivals) == ((11, 11), (), 0, 0)
    assert (c.period_s, c.decode_contexts, c.new, c.arrivals) == (pytest.approx(0.002), (12,), 0, 0)


def test_a_step_whose_members_do_not_add_up_does_not_count() -> None:
    run = _run([0.001, 0.003], [(10, 0), (11, 2)], [[(0, 0)], [(1, 0), (0, 1)]], [0.0, 0.0015])
    assert stream_steps(run, {0: 10, 1: 11}) == ([], 1)


def test_a_run_without_members_is_refused() -> None:
    run = _run([0.001], [(10, 0)], [[(0, 0)]], [0.0])
    run.members = None
    with pytest.raises(RuntimeError, match="members"):
        stream_steps(run, {0: 10})


def test_a_stream_step_plans_its_decodes_and_prompts() -> None:
    plan = StreamStep(0.01, (100, 50), (30,), 1, 0).plan()
    assert plan.decode_rows == 2 and plan.decode_kv == 152 and plan.prefill_q == [30]
    assert plan.sampled_tokens == 3
    # only the prompt is scheduled for the first time
    assert [s.first_scheduled_s < 0 for s in plan.seqs] == [False, False, True]


def test_the_fit_recovers_each_term_by_hand() -> None:
    """Periods = 1 ms/request (the model) + 0.2 ms/step + 15 us/row + 4 us/prompt token + 0.5 ms/new request +
    0.3 ms/arrival, on varied steps: the fit finds each term, and charges 0.8 ms and 4 us per prompt token."""
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(300):
        rows = int(rng.integers(1, 40))
        prompts = tuple(int(p) for p in rng.integers(5, 300, rng.integers(0, 3)))
        arrivals = int(rng.integers(0, 3))
        t = 1e-3 * (rows + len(prompts)) + 2e-4 + 15e-6 * (rows + len(prompts)) + 4e-6 * sum(prompts) \
            + 5e-4 * len(prompts) + 3e-4 * arrivals
        steps.append(StreamStep(t, (100,) * rows, prompts, len(prompts), arrivals))
    fit = fit_stream(PerRow(), steps)
    assert fit.per_step_s == pytest.approx(2e-4, rel=1e-4) and fit.per_row_s == pytest.approx(15e-6, rel=1e-4)
    assert fit.per_prefill_token_s == pytest.approx(4e-6, rel=1e-4)
    assert fit.per_new_s == pytest.approx(5e-4, rel=1e-4)
    assert fit.per_arrival_s == pytest.approx(3e-4, rel=1e-4)
    assert fit.new_request_s == pytest.approx(8e-4, rel=1e-4)
    assert fit.new_request_token_s == pytest.approx(4e-6, rel=1e-4)
    assert fit.residual_median_s == pytest.approx(0, abs=1e-9)


def test_too_few_steps_are_an_input_error() -> None:
    with pytest.raises(InputError, match="too few"):
        fit_stream(PerRow(), [StreamStep(1e-3, (10,), (), 0, 0)] * 5)


@pytest.mark.parametrize("entry", [{"period_s": 0.0, "decode_contexts": [], "prefills": [], "new": 0,
                                    "arrivals": 0},
                                   {"period_s": 1e-3, "decode_contexts": [-1], "prefills": [], "new": 0,
                                    "arrivals": 0},
                                   {"period_s": 1e-3}, "x"])
def test_a_malformed_stream_step_is_an_input_error(entry: object) -> None:
    with pytest.raises(InputError, match="served_stream"):
        StreamStep.from_json(entry)


def _new_and_old(prompt: int) -> tuple[BatchPlan, BatchPlan]:
    """A step of 3 decodes and a new prompt, and the same step with the prompt scheduled before."""
    def plan(scheduled: bool) -> BatchPlan:
        ds = [Seq(i, 0.0, 100, 10) for i in range(3)]
        for s in ds:
            s.computed, s.generated, s.first_scheduled_s = 100, 1, 0.0
        p = Seq(9, 0.0, prompt, 5)
        if scheduled:
            p.first_scheduled_s = 0.0
        return hybrid(ds, [p], [prompt])
    return plan(False), plan(True)


def test_a_new_request_pays_its_terms_once() -> None:
    """A fit's new-request terms (the roofline has none: its step overheads take no such setting)."""
    steps = StepOverheads("eager", 0.0, 0.0, 0.0, 0.0, "test", new_request_s=8e-4, new_request_token_s=4e-6)
    data = Fitted.load(SHIPPED).to_json()
    data["step_overheads"] = steps.to_json()
    cost: CostModel = Fitted.from_json(data)
    new, old = _new_and_old(200)
    assert cost.iteration_time(new) - cost.iteration_time(old) == pytest.approx(8e-4 + 4e-6 * 200, rel=1e-6)
    # a stretch of the prompt's chunks: only its first repeat schedules it for the first time
    times = cost.stretch_times(new, 3)
    plain = cost.stretch_times(old, 3)
    assert times[0] - plain[0] == pytest.approx(8e-4 + 8e-4, rel=1e-6)
    assert times[1:] == pytest.approx(plain[1:], rel=1e-9)


def test_under_the_launch_floor_only_the_first_repeat_pays_the_new_request() -> None:
    """Eager execution: a step takes at least its host terms + the launch floor; the new request's terms are
    host terms of the stretch's first repeat only."""
    steps = StepOverheads("eager", 0.0, 0.0, 0.0, 1.0, "test", new_request_s=8e-4, new_request_token_s=4e-6)
    data = Fitted.load(SHIPPED).to_json()
    data["step_overheads"] = steps.to_json()
    cost: CostModel = Fitted.from_json(data)
    new, _ = _new_and_old(200)
    first = 8e-4 + 4e-6 * 200
    assert cost.iteration_time(new) == pytest.approx(1.0 + first, rel=1e-12)
    assert cost.stretch_times(new, 3) == pytest.approx([1.0 + first, 1.0, 1.0], rel=1e-12)


def test_calibrate_adds_the_streams_terms() -> None:
    """A fit priced at p, closed batches served at p exactly, a stream at p + 0.6 ms/new + 0.2 ms/arrival + 3
    us/prompt token: the calibrated fit charges 0.8 ms and 3 us per prompt token to each new request."""
    fitted = Fitted.load(SHIPPED)
    price = fitted.iteration_time
    closed = [{"batch": b, "context": 120, "time_s": price(decode_plan(b, 120)), "model_s": 0.0, "steps": 10}
              for b in (1, 8, 32)]
    rng = np.random.default_rng(1)
    stream = []
    for _ in range(200):
        decodes = tuple(int(c) for c in rng.integers(50, 400, rng.integers(1, 30)))
        prompts = tuple(int(p) for p in rng.integers(5, 300, rng.integers(0, 3)))
        s = StreamStep(1.0, decodes, prompts, 0, int(rng.integers(0, 3)))
        period = price(s.plan()) + 6e-4 * len(s.prefills) + 2e-4 * s.arrivals + 3e-6 * sum(s.prefills)
        stream.append({**s.to_json(), "period_s": period, "new": len(s.prefills)})
    calibrated, _ = calibrate(fitted, {"served_steps": closed, "served_stream": stream})
    o = calibrated.step_overheads
    assert o.new_request_s == pytest.approx(8e-4, rel=1e-3)
    assert o.new_request_token_s == pytest.approx(3e-6, rel=1e-3)
    assert "request stream: 200 served steps" in o.source
    assert calibrated.fit["served_stream_fit"]["steps"] == 200


def test_the_new_request_terms_are_written_only_when_set() -> None:
    plain = StepOverheads("eager", 1e-3, 0.0, 0.0, 0.0, "test")
    assert "new_request_s" not in plain.to_json() and "new_request_token_s" not in plain.to_json()
    assert StepOverheads.from_json(plain.to_json()) == plain
    priced = replace(plain, new_request_s=4e-4, new_request_token_s=5e-6)
    assert priced.to_json()["new_request_s"] == 4e-4
    assert StepOverheads.from_json(priced.to_json()) == priced
