"""Sessions as workloads: the `--trace sessions` generator, session trace files, and a run's per-session
results (simctl.traces.sessions, simctl.traces.loaders, simctl.results.sessions)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simctl.common.errors import InputError
from simctl.policies.seq import Seq
from simctl.results.sessions import session_summary
from simctl.serving.records import request_columns
from simctl.sim.run import RunConfig, run
from simctl.traces.build import build_trace
from simctl.traces.lengths import scale_lengths
from simctl.traces.sessions import LMSYS_CHAT_1M
from simctl.traces.workload import Workload

# ---------------------------------------------------------------- the generator


def test_a_seeded_session_resends_its_context_answers_included() -> None:
    # seed 7 draws turns (2, 4, ...), new tokens (234, 1, 194, 40, 21) and answers (116, 67, 193, 230, 404);
    # 5 turns: session 0 has its 2, session 1 is cut from 4 turns to the 3 left; both drew system prompt 0
    reqs = build_trace("sessions", 5, 2.0, 7, system_prompt_tokens=100, system_prompts=3,
                       session_think_s=4.0)
    assert [(r.session, r.previous, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0, -1, 100 + 234, 116),
        (0, 0, 100 + 234 + 116 + 1, 67),
        (1, -1, 100 + 194, 193),
        (1, 2, 100 + 194 + 193 + 40, 230),
        (1, 3, 100 + 194 + 193 + 40 + 230 + 21, 404),
    ]
    assert [(r.prefix_group, r.prefix_tokens) for r in reqs] == [(0, 100)] * 5
    assert reqs[0].think_s == reqs[2].think_s == 0.0  # a first turn is sent at its session's start
    assert reqs[1].think_s == pytest.approx(12.578693272279624)  # exponential, mean 4 s
    assert reqs[0].arrival_s == reqs[1].arrival_s < reqs[2].arrival_s == reqs[4].arrival_s


def test_sessions_share_their_system_prompts() -> None:
    reqs = build_trace("sessions", 400, 1.0, 0, system_prompt_tokens=64, system_prompts=3,
                       session_think_s=1.0)
    first = [r for r in reqs if r.previous < 0]
    assert {r.prefix_group for r in first} == {0, 1, 2}
    assert all(r.prefix_tokens == 64 for r in reqs)
    for r in reqs:  # a session keeps its system prompt
        if r.previous >= 0:
            assert r.prefix_group == reqs[r.previous].prefix_group
    none = build_trace("sessions", 20, 1.0, 0)
    assert {(r.prefix_group, r.prefix_tokens) for r in none} == {(-1, 0)}


def test_generated_lengths_follow_the_published_means() -> None:
    reqs = build_trace("sessions", 20_000, 1.0, 1, session_think_s=3.0)
    sessions = len({r.session for r in reqs})
    new = [r.prompt_tokens - (reqs[r.previous].prompt_tokens + reqs[r.previous].output_tokens
                              if r.previous >= 0 else 0) for r in reqs]
    assert 20_000 / sessions == pytest.approx(LMSYS_CHAT_1M.turns, rel=0.03)  # the last one cut: negligible
    assert np.mean(new) == pytest.approx(LMSYS_CHAT_1M.new_tokens, rel=0.03)
    assert np.mean([r.output_tokens for r in reqs]) == pytest.approx(LMSYS_CHAT_1M.answer_tokens, rel=0.03)
    assert np.mean([r.think_s for r in reqs if r.previous >= 0]) == pytest.approx(3.0, rel=0.05)
    starts = np.asarray([r.arrival_s for r in reqs if r.previous < 0])
    assert (sessions - 1) / (starts[-1] - starts[0]) == pytest.approx(1.0, rel=0.05)  # sessions per second


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(1, 300), system=st.integers(0, 3000),
       prompts=st.integers(1, 4), scale=st.sampled_from([1.0, 0.05, 0.5, 3.0]))
def test_generated_turns_chain_exactly(seed: int, n: int, system: int, prompts: int, scale: float) -> None:
    """prompt_k = prompt_{k-1} + output_{k-1} + new_k, new_k the k-th drawn new-message length (scaled), links
    consistent, ids by session start then turn."""
    reqs = build_trace("sessions", n, 3.0, seed, scale=scale, system_prompt_tokens=system,
                       system_prompts=prompts if system else 1, session_think_s=2.0)
    rng = np.random.default_rng(seed)
    rng.geometric(0.5, size=n)  # the documented draw order: turns, then new tokens
    new = scale_lengths(rng.geometric(1 / LMSYS_CHAT_1M.new_tokens, size=n), scale).tolist()
    sys_tokens = int(scale_lengths(np.asarray([system]), scale)[0]) if system else 0
    assert len(reqs) == n and [r.id for r in reqs] == list(range(n))
    for r in reqs:
        assert r.prefix_tokens == sys_tokens and (r.prefix_group >= 0) == (sys_tokens > 0)
        if r.previous < 0:
            assert r.prompt_tokens == sys_tokens + new[r.id] and r.think_s == 0.0
            before = reqs[r.id - 1] if r.id else None
            assert before is None or (r.session == before.session + 1 and r.arrival_s >= before.arrival_s)
        else:
            p = reqs[r.previous]
            assert r.previous == r.id - 1 and p.session == r.session and p.arrival_s == r.arrival_s
            assert r.prompt_tokens == p.prompt_tokens + p.output_tokens + new[r.id]
            assert r.think_s >= 0 and r.prefix_group == p.prefix_group


def test_workload_options_of_sessions() -> None:
    w = Workload(trace="sessions", qps=2.0, num_requests=30, system_prompt_tokens=50, system_prompts=2,
                 session_think_time=0.0)
    w.validate()
    reqs = w.requests()
    assert len(reqs) == 30 and all(r.think_s == 0.0 for r in reqs)
    assert {"system_prompt_tokens", "system_prompts", "session_think_time"} <= set(w.recorded())
    cases = [
        ({"trace": "sharegpt", "system_prompts": 2, "system_prompt_tokens": 9},
         ("--system-prompt-tokens, --system-prompts describe(s) generated sessions: give --trace sessions (a "
          "session trace file gives each turn's think_s itself)")),
        ({"trace": "sessions", "system_prompts": 2},
         "--system-prompts 2 needs --system-prompt-tokens (their length)"),
        ({"trace": "sessions", "qps": None},
         "--qps is needed: generated trace 'sessions' gives no arrival times"),
        ({"trace": "sessions", "session_think_time": -1.0},
         "--session-think-time must be a number of seconds >= 0, got -1.0"),
        ({"trace": "sessions", "system_prompt_tokens": -3},
         "--system-prompt-tokens must be an integer >= 0, got -3"),
        ({"trace": "sessions", "system_prompts": 0}, "--system-prompts must be an integer >= 1, got 0"),
    ]
    for fields, message in cases:
        with pytest.raises(InputError) as e:
            Workload(**{"qps": 1.0, **fields}).validate()
        assert str(e.value) == message


# ---------------------------------------------------------------- session trace files

CSV = """session_id,num_new_tokens,num_decode_tokens,think_s,arrived_at
a,10,5,,0.0
b,20,7,,1.0
a,3,4,2.5,
b,6,8,0.5,
a,2,1,1,
"""
JSONL = """{"session_id": "a", "new_tokens": 10, "output_tokens": 5, "arrival_s": 0.0}
{"session_id": "b", "new_tokens": 20, "output_tokens": 7, "arrival_s": 1.0}
{"session_id": "a", "new_tokens": 3, "output_tokens": 4, "think_s": 2.5}
{"session_id": "b", "new_tokens": 6, "output_tokens": 8, "think_s": 0.5}
{"session_id": "a", "new_tokens": 2, "output_tokens": 1, "think_s": 1}
"""
# (id, session, previous, arrival, prompt, output, think): session a's turns, then b's, each turn's prompt
# its context (earlier turns' new tokens and answers) plus its new tokens
EXPECTED = [
    (0, 0, -1, 0.0, 10, 5, 0.0),
    (1, 0, 0, 0.0, 10 + 5 + 3, 4, 2.5),
    (2, 0, 1, 0.0, 10 + 5 + 3 + 4 + 2, 1, 1.0),
    (3, 1, -1, 1.0, 20, 7, 0.0),
    (4, 1, 3, 1.0, 20 + 7 + 6, 8, 0.5),
]


def _rows(reqs: list) -> list[tuple]:
    return [(r.id, r.session, r.previous, r.arrival_s, r.prompt_tokens, r.output_tokens, r.think_s)
            for r in reqs]


@pytest.mark.parametrize(("name", "text"), [("t.csv", CSV), ("t.jsonl", JSONL)])
def test_a_session_file_chains_its_turns(tmp_path: Path, name: str, text: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert _rows(build_trace(path, None, None, 0)) == EXPECTED
    assert _rows(build_trace(path, 2, None, 0)) == EXPECTED[:2]  # turns counted by session, then turn
    # a rate time-scales the sessions' starts (0 and 1 s: one session per second)
    assert [r.arrival_s for r in build_trace(path, None, 2.0, 0)] == [0.0] * 3 + [0.5] * 2
    scaled = build_trace(path, None, None, 0, scale=2.0)  # the new tokens and answers scaled, then chained
    assert [r.prompt_tokens for r in scaled] == [20, 20 + 10 + 6, 20 + 10 + 6 + 8 + 4, 40, 40 + 14 + 12]


def test_a_session_file_without_arrivals_starts_sessions_at_the_rate(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("session_id,num_new_tokens,num_decode_tokens\n7,4,2\n8,5,3\n7,1,1\n")
    reqs = build_trace(path, None, 1.0, 3)
    assert [(r.session, r.previous, r.prompt_tokens) for r in reqs] == [(0, -1, 4), (0, 0, 7), (1, -1, 5)]
    assert reqs[0].arrival_s == reqs[1].arrival_s < reqs[2].arrival_s


BAD = [
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens,arrived_at\na,1,1,0\na,1,1,2\n",
     ("line 3: arrived_at given on a later turn of session 'a': it is sent think_s after its previous turn "
      "completed; leave it out")),
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens,arrived_at\na,1,1,0\nb,1,1,\n",
     "line 3: arrived_at is missing on the first turn of session 'b'"),
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens,arrived_at\na,1,1,2\nb,1,1,1\n",
     "line 3: arrived_at 1.0 is earlier than 2.0 on line 2; arrivals must be sorted (non-decreasing)"),
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens,think_s\na,1,1,3\n",
     ("line 2: think_s is 3.0 on the first turn of its session: a first turn is sent at its arrival, the "
      "think time is the pause after the previous turn")),
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens,think_s\na,1,1,\na,1,1,-1\n",
     "line 3: think_s is -1.0, expected a finite number of seconds >= 0"),
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens\na,1,1\n,1,1\n", "line 3: session_id is empty"),
    ("t.csv", "session_id,num_new_tokens,num_decode_tokens\na,0,1\n",
     "line 2: num_new_tokens is 0, expected >= 1"),
    ("t.csv", "session_id,num_prefill_tokens,num_decode_tokens\na,1,1\n",
     ("num_prefill_tokens given with session_id: a session's turn gives its new tokens (num_new_tokens), its "
      "prompt is its session's context plus them")),
    ("t.csv", "num_new_tokens,num_decode_tokens,think_s\n1,1,0\n",
     "num_new_tokens, think_s describe(s) a session's turn: give session_id too"),
    ("t.jsonl",
     '{"session_id": 1, "new_tokens": 1, "output_tokens": 1}\n{"new_tokens": 1, "output_tokens": 1}\n',
     "line 2: lacks 'session_id' unlike line 1: give it on every line or none"),
    ("t.jsonl", '{"session_id": true, "new_tokens": 1, "output_tokens": 1}\n',
     "line 1: session_id is True, expected a string or an integer"),
    ("t.jsonl", '{"session_id": 1, "prompt_tokens": 1, "output_tokens": 1}\n',
     ("line 1: prompt_tokens given with session_id: a session's turn gives its new tokens (new_tokens), its "
      "prompt is its session's context plus them")),
    ("t.jsonl", '{"session_id": 1, "output_tokens": 1}\n', "line 1: missing key 'new_tokens'"),
    ("t.jsonl", '{"session_id": 1, "new_tokens": 1, "output_tokens": 1, "arrival_s": NaN}\n',
     "line 1: arrival_s is nan, not a number"),
    ("t.jsonl", ('{"session_id": 1, "new_tokens": 1, "output_tokens": 1}\n'
                 '{"session_id": 2, "new_tokens": 1, "output_tokens": 1, "arrival_s": 3}\n'),
     "line 1: arrival_s is missing on the first turn of session 1"),
    ("t.jsonl", ('{"session_id": "x", "new_tokens": 5, "output_tokens": 1, "prefix_group": 0, '
                 '"prefix_tokens": 5}\n'
                 '{"session_id": "x", "new_tokens": 1, "output_tokens": 1, "prefix_group": 0, '
                 '"prefix_tokens": 8}\n'),
     "line 2: prefix_tokens is 8, expected an integer from 0 to the prompt's 7 tokens"),
]


@pytest.mark.parametrize(("name", "text", "message"), BAD)
def test_a_bad_session_file_is_refused_in_one_line(tmp_path: Path, name: str, text: str,
                                                   message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as e:
        build_trace(path, None, 1.0, 0)
    text = str(e.value)
    assert text.startswith(f"trace file {path}") and "\n" not in text
    assert text.endswith(message)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(1, 50), st.integers(1, 50),
                          st.sampled_from([0, 0.5, 3])), min_size=1, max_size=30))
def test_a_session_file_turns_chain_whatever_their_interleaving(
        tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[int, int, int, float]]) -> None:
    path = tmp_path_factory.mktemp("s") / "t.csv"
    seen: set[int] = set()
    lines = []
    for label, new, out, think in rows:
        lines.append(f"s{label},{new},{out},{'' if label not in seen else think}")
        seen.add(label)
    path.write_text("session_id,num_new_tokens,num_decode_tokens,think_s\n" + "\n".join(lines) + "\n")
    reqs = build_trace(path, None, 1.0, 0)
    by_label = {label: [r for r in rows if r[0] == label] for label in dict.fromkeys(r[0] for r in rows)}
    expected = list(by_label.values())  # sessions by first row, turns in file order
    got = [[r for r in reqs if r.session == k] for k in range(len(expected))]
    assert sum(map(len, got)) == len(reqs) == len(rows)
    for turns, requests in zip(expected, got, strict=True):
        context = 0
        for k, ((_, new, out, think), r) in enumerate(zip(turns, requests, strict=True)):
            assert (r.prompt_tokens, r.output_tokens) == (context + new, out)
            assert r.previous == (r.id - 1 if k else -1) and r.think_s == (think if k else 0.0)
            assert r.arrival_s == requests[0].arrival_s
            context += new + out


def test_a_simulated_run_reports_its_sessions() -> None:
    workload = Workload(trace="sessions", qps=2.0, num_requests=40, seed=3, system_prompt_tokens=32,
                        system_prompts=2, session_think_time=0.5, scale=0.2)
    reqs = workload.requests()
    result = run(RunConfig(policy="vllm-v1", workload=workload, model="tiny",
                           options={"enable_prefix_caching": 1}))
    table = result.result.requests.sort_values("request_id")
    assert table["session"].tolist() == [r.session for r in reqs]
    block = result.summary["sessions"]
    assert block["num_sessions"] == len({r.session for r in reqs}) == block["completed_sessions"]
    assert block["turns_per_session_max"] == max(table["turn"]) + 1
    assert result.summary["prefix_cache_hits"] > 0
    assert {"system_prompt_tokens": 32, "system_prompts": 2, "session_think_time": 0.5}.items() \
        <= result.summary.items()


# ---------------------------------------------------------------- per-session results


def _seq(id: int, session: int, sent: float, first: float, done: float) -> Seq:
    s = Seq(id, sent, 10, 4, session=session)
    s.first_token_s, s.completion_s = first, done
    return s


def test_the_summary_reports_each_sessions_turns_duration_and_ttft_by_turn() -> None:
    seqs = [_seq(0, 0, 0.0, 0.5, 2.0), _seq(1, 0, 3.0, 3.2, 5.0),  # session 0: 0 s to 5 s
            _seq(3, 1, 6.0, 6.4, 8.0), _seq(2, 1, 1.0, 1.1, 4.0), _seq(4, 1, 9.0, 9.3, 10.0),  # 1 s to 10 s
            _seq(5, -1, 0.0, 0.1, 1.0),  # a request of no session
            _seq(6, 2, 2.0, 2.5, -1.0)]  # a session cut short: no duration
    req = request_columns(seqs)
    assert req["turn"].tolist() == [0, 1, 1, 0, 2, -1, 0]  # the rank of its id in its session
    assert req["session"].tolist() == [0, 0, 1, 1, 1, -1, 2]
    block = session_summary(req)
    assert block is not None
    ttft = block.pop("ttft_p50_by_turn")
    assert block == {"num_sessions": 3, "completed_sessions": 2,
                     "turns_per_session_mean": pytest.approx(2.0), "turns_per_session_max": 3,
                     "session_duration_p50": pytest.approx(7.0), "session_duration_p90": pytest.approx(8.6)}
    # turn 0: 0.5 and 0.1 s; turn 1: 0.2 and 0.4 s; turn 2: 0.3 s; no turn 3
    assert ttft == [pytest.approx(0.3), pytest.approx(0.3), pytest.approx(0.3), None]


def test_a_run_without_sessions_has_no_session_columns() -> None:
    req = request_columns([_seq(0, -1, 0.0, 1.0, 2.0)])
    assert "session" not in req and "turn" not in req and session_summary(req) is None
