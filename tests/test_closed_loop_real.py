"""Closed-loop clients on simctl's own engine (issue 37): each request is pushed when a client sends it and
timed from there; every request still gets exactly its tokens alone."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from conftest import ENGINE_MODEL, ENGINE_SEED

from simctl.catalogue.gpus import get_gpu
from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.costs.roofline import Roofline
from simctl.engine.real import run_real, write_real
from simctl.engine.serve import Engine, prompt_ids
from simctl.engine.setup import RealConfig, size_run, sized_policy
from simctl.executor.ragged import RaggedExecutor
from simctl.serving.clients import Clients
from simctl.traces.request import Request
from simctl.traces.workload import Workload
from simctl.validation.replay import replay_real

SPEC = get_model(ENGINE_MODEL)
pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]

LENGTHS = [(37, 9), (5, 14), (70, 3), (1, 8), (22, 1), (48, 12), (13, 6), (64, 10)]


def _in_flight_at_most(arrivals: np.ndarray, completions: np.ndarray) -> int:
    """The most requests in flight at once (a completion before a send at the same instant)."""
    events = sorted([(t, 1) for t in arrivals] + [(t, -1) for t in completions])
    return int(max(np.cumsum([e for _, e in events])))


def test_two_clients_send_every_request_and_keep_two_in_flight(model, alone) -> None:
    # the last two are a session's turns: the second follows the first after 5 ms
    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate(LENGTHS[:6])]
    requests += [Request(6, 0.0, 13, 6, session=0), Request(7, 0.0, 64, 10, session=0, previous=6,
                                                             think_s=0.005)]
    config = RealConfig(policy="sarathi", workload=Workload(trace="sharegpt", qps=None, num_requests=8,
                                                            concurrency=2), model=ENGINE_MODEL)
    size = size_run(config, requests, SPEC.kv_bytes_per_token(4), 1 << 30)
    engine = Engine(sized_policy(config, size), RaggedExecutor(model, size.kv_slots, size.kv_slot_tokens),
                    {r.id: prompt_ids(r.id, r.prompt_tokens, SPEC.vocab_size, ENGINE_SEED) for r in requests})
    out = engine.serve_clients(requests, Clients(requests, concurrency=2))
    by_id = {s.id: s for s in out.seqs}
    for r in requests:
        s = by_id[r.id]
        assert out.tokens[r.id] == alone(r) and s.generated == r.output_tokens
        assert s.arrival_s <= s.first_scheduled_s <= s.first_token_s <= s.completion_s
    arrival = np.array([s.arrival_s for s in out.seqs])
    completion = np.array([s.completion_s for s in out.seqs])
    assert _in_flight_at_most(arrival, completion) == 2
    assert by_id[7].arrival_s >= by_id[6].completion_s + 0.005
    assert not engine.executor.slots.of and engine.policy.kv.used == 0


def test_a_real_run_records_the_bound_and_its_log_replays_from_the_sends(tmp_path) -> None:
    """The summary has the bound and the requests in flight; the replay of its log, each request arriving
    at its send, re-plans every iteration the engine ran."""
    r = run_real(RealConfig(policy="sarathi", model=ENGINE_MODEL, threads=1,
                            workload=Workload(trace="arxiv", qps=None, num_requests=4, scale=0.01,
                                              concurrency=1)))
    s, req = r.summary, r.result.request_columns
    assert s["completed"] == 4 and s["concurrency"] == 1 and 0 < s["in_flight_mean"] <= 1
    assert (req["arrival_s"][1:] >= req["completion_s"][:-1]).all()  # one at a time
    write_real(r, tmp_path)
    replay = replay_real(s, pd.read_parquet(tmp_path / "iterations.parquet"), Roofline(SPEC, get_gpu("cpu")),
                         pd.read_parquet(tmp_path / "requests.parquet"))
    assert replay.matched == replay.total == s["iterations"]


def test_real_disaggregation_refuses_a_closed_loop_in_one_line() -> None:
    config = RealConfig(policy="vllm", model=ENGINE_MODEL, prefill_instances=1, decode_instances=1,
                        workload=Workload(trace="sharegpt", qps=None, num_requests=4, concurrency=2))
    with pytest.raises(InputError, match="--concurrency"):
        config.validate()
