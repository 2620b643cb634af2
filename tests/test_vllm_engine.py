"""`simctl real --engine vllm`: a simctl trace served by the installed vLLM gives every request exactly its
output tokens and records, step by step, what simctl's own real mode records (one engine serves every run
here: conftest's vllm_server, started once for the session)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from simctl.traces.workload import Workload

pytest.importorskip("vllm")

from simctl.cli import main
from simctl.engine.setup import RealConfig
from simctl.engine.vllm_real import run_summary, vllm_args_for
from simctl.executor.vllm_runtime import INSTALL_HINT, engine_args
from simctl.traces.request import Request
from simctl.traces.tokens import prompt_token_ids
from simctl.validation.prefix_hits import serial_hits
from simctl.validation.routed_hits import check_routed
from simctl.validation.twin import twin_policy, vllm_twin

pytestmark = pytest.mark.vllm

SIMCTL = Path(sys.executable).parent / "simctl"
SHARED = 256  # prefix tokens a group shares: two of vLLM's 128-token blocks on the CPU
TWIN_FIELDS = ("engine", "vllm_version", "num_gpu_blocks", "block_size", "max_num_seqs",
               "max_num_batched_tokens", "enable_prefix_caching", "long_prefill_token_threshold",
               "max_model_len", "dtype", "prefix_cache_hit_rate", "trace", "qps", "num_requests", "scale",
               "seed", "arrival", "cv", "policy")


# 24 short requests over about half a second: prompts of 5 to 400 tokens, outputs of 1 to 12
REQUESTS = [Request(i, 0.02 * i, 5 + (i * 37) % 400, 1 + (i * 5) % 12) for i in range(24)]
# two prefix groups; each group's later requests arrive after its first has been prefilled
# two sessions of three turns sharing a 256-token system prompt, each later turn its session's context (the
# turn before's prompt and output) plus new tokens; at concurrency 1 they run 0, 1, 2, 3, 4, 5 (a completed
# turn's follower queues behind the first turn already waiting). vLLM caches the full blocks of a turn's
# prompt + output - 1 tokens (the last sampled token is never computed) and a lookup stops before a prompt's
# last token, so the hits are, in blocks of 128: r1 (its prompt is the system prompt): (256 - 1) // 128 = 1;
# r2: r0's (400 + 100 - 1) // 128 = 3; r3: r1's 355 // 128 = 2; r4: r2's 709 // 128 = 5; r5, whose prompt is
# exactly r3's context of 640 tokens: 639 // 128 = 4.
_SYSTEM = {"prefix_group": 0, "prefix_tokens": SHARED}
SESSIONS = [Request(0, 0.0, 400, 100, session=0, **_SYSTEM), Request(1, 0.0, 256, 100, session=1, **_SYSTEM),
            Request(2, 0.0, 650, 60, session=0, previous=0, **_SYSTEM),
            Request(3, 0.0, 456, 184, session=1, previous=1, **_SYSTEM),
            Request(4, 0.0, 810, 20, session=0, previous=2, **_SYSTEM),
            Request(5, 0.0, 640, 10, session=1, previous=3, think_s=0.05, **_SYSTEM)]
SESSION_HITS = [0, 128, 3 * 128, 2 * 128, 5 * 128, 4 * 128]
# Mooncake rows (hash blocks of 64 tokens: two a KV block of 128), outputs of 4 (no output block fills),
# served one at a time: a block hits when both its ids were cached; a lookup stops before the last token.
# r1 shares ids 1-4 with r0: 2 blocks; r2 (200 tokens) looks up 1 block, ids 1-2; r3 is r1's first 6 ids,
# block-aligned: 383 // 128 = 2 blocks; r4 shares id 1 only, not block 0's id 2: none; r5 continues r1's ids:
# blocks 0-2 (ids 1-7), the third of r1's 403 computed tokens' blocks.
_ROW = {"hash_block": 64}
MOONCAKE = [Request(0, 0.0, 300, 4, hash_ids=(1, 2, 3, 4, 5), **_ROW),
            Request(1, 0.0, 400, 4, hash_ids=(1, 2, 3, 4, 6, 7, 8), **_ROW),
            Request(2, 0.0, 200, 4, hash_ids=(1, 2, 9, 10), **_ROW),
            Request(3, 0.0, 384, 4, hash_ids=(1, 2, 3, 4, 6, 7), **_ROW),
            Request(4, 0.0, 150, 4, hash_ids=(1, 12, 13), **_ROW),
            Request(5, 0.0, 450, 4, hash_ids=(1, 2, 3, 4, 6, 7, 8, 14), **_ROW)]
MOONCAKE_HITS = [0, 256, 128, 256, 0, 384]
# four sessions of three turns sharing the system prompt, starting 0.1 s apart; turn t of session s has its
# context plus 60 + 20 s + 10 t new tokens and 40 outputs (ids 3 s + t). The session router (in the twin)
# puts session 0 on replica 0, session 1 on replica 1 (0 has one outstanding), 2 and 3 likewise. Hits, in
# blocks of 128 as in SESSIONS: a session's first turn finds nothing (the first on its replica) or the system
# prompt's 2 blocks; a later turn its previous turn's (prompt + 40 - 1) // 128 blocks. Session 0: prompts 316,
# 426, 546, hits 0, 355 // 128 = 2, 465 // 128 = 3 blocks; session 2: 356, 506, 666, hits 2, 395 // 128 = 3,
# 545 // 128 = 4; sessions 1 and 3 the same blocks.
ROUTED = [Request(3 * s + t, 0.1 * s, SHARED + sum(60 + 20 * s + 10 * u + 40 for u in range(t)) + 60 + 20 * s
                  + 10 * t, 40, session=s, previous=3 * s + t - 1 if t else -1, **_SYSTEM)
          for s in range(4) for t in range(3)]
ROUTED_HITS = [128 * b for b in (0, 2, 3, 0, 2, 3, 2, 3, 4, 2, 3, 4)]
GROUPED = [Request(i, 0.1 * i, SHARED + 20 + i, 4, prefix_group=i % 2, prefix_tokens=SHARED)
           for i in range(6)] + [Request(6, 0.65, SHARED + 30, 4)]


@pytest.fixture(scope="module")
def server(vllm_server):
    return vllm_server  # conftest's: one engine for the session


def test_every_request_gets_exactly_its_tokens_and_the_records_add_up(server) -> None:
    run = server.serve(REQUESTS)
    req, its = run.result.requests, run.result.iterations.frame()
    assert (req["generated_tokens"] == req["output_tokens"]).all() and (req["completion_s"] > 0).all()
    assert (req["arrival_s"] <= req["first_scheduled_s"]).all()
    assert (req["first_scheduled_s"] <= req["first_token_s"]).all()
    assert (req["first_token_s"] <= req["completion_s"]).all()
    assert req["preemptions"].sum() == 0
    # every prompt token prefilled once (none cached: ids are random), every later token one decode row
    assert (its["prefill_tokens"].sum() == req["prompt_tokens"].sum()
            and req["prefix_cached_tokens"].sum() == 0)
    assert its["decode_tokens"].sum() == req["output_tokens"].sum() - len(req)
    assert run.result.gaps.total == req["output_tokens"].sum() - len(req)
    assert (its["start_s"].diff().dropna() > 0).all() and (its["duration_s"] > 0).all()
    assert its["batch_size"].max() > 1, "nothing was batched: the test proves little"
    config = RealConfig(policy="vllm", workload=Workload(trace="sharegpt", qps=40.0,
                                                         num_requests=len(REQUESTS)), model="tiny")
    summary = run_summary(config, server, run, 1.0)
    assert all(k in summary for k in TWIN_FIELDS) and summary["engine"] == "vllm"
    assert summary["completed"] == len(REQUESTS) and summary["tbt_p50"] > 0
    # the blocks requests can hold: vLLM's pool keeps one as its null block
    assert summary["kv_capacity_tokens"] == (summary["num_gpu_blocks"] - 1) * summary["block_size"]
    json.dumps(summary, allow_nan=False)
    twin = twin_policy(summary)  # the simulator's vllm-v1, configured as the engine resolved its settings
    assert twin.name == "vllm-v1" and twin.kv.capacity == summary["kv_capacity_tokens"]
    assert twin.settings.max_batch_size == summary["max_num_seqs"]
    assert twin.settings.block_size == summary["block_size"]


def test_prefix_groups_hit_the_prefix_cache_and_nothing_else_does(server) -> None:
    for _ in range(2):  # the cache is reset between runs: the second run starts cold again
        run = server.serve(GROUPED)
        cached = run.result.requests.set_index("request_id")["prefix_cached_tokens"]
        assert cached[0] == cached[1] == 0 and cached[6] == 0, cached  # first of each group, and no group
        assert (cached[2:6] == SHARED).all(), cached
        assert run.fields["prefix_cache_hits"] == 4 * SHARED
        assert run.fields["prefix_cache_hit_rate"] == pytest.approx(
            4 * SHARED / sum(r.prompt_tokens for r in GROUPED), rel=0.01)


def test_session_turns_resend_their_context_and_vllm_reuses_what_the_twin_does(server) -> None:
    run = server.serve(SESSIONS, concurrency=1)
    req = run.result.requests
    assert req["prefix_cached_tokens"].tolist() == SESSION_HITS
    assert run.fields["prefix_cache_hits"] == sum(SESSION_HITS)
    assert run.fields["prefix_cache_queries"] == sum(r.prompt_tokens for r in SESSIONS)
    # one client: each request sent after the one before completed (r5 after its think time too)
    sent, done = req["arrival_s"].to_numpy(), req["completion_s"].to_numpy()
    assert (sent[1:] >= done[:-1]).all() and sent[5] >= done[3] + 0.05
    settings = server.settings()
    twin = vllm_twin(settings)
    assert serial_hits(SESSIONS, twin) == SESSION_HITS


def test_mooncake_rows_share_the_blocks_of_their_equal_hash_ids_in_vllm_as_in_the_twin(server) -> None:
    run = server.serve(MOONCAKE, concurrency=1)
    assert run.result.requests["prefix_cached_tokens"].tolist() == MOONCAKE_HITS
    assert run.fields["prefix_cache_hits"] == sum(MOONCAKE_HITS)
    settings = server.settings()
    twin = vllm_twin(settings)
    assert serial_hits(MOONCAKE, twin) == MOONCAKE_HITS


def test_a_routed_session_trace_leaves_each_replica_the_cache_vllm_builds_for_its_share(server) -> None:
    checks = check_routed(ROUTED, server, "session", 2)
    assert [sorted(c.served) for c in checks] == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    for c in checks:
        assert c.vllm == [ROUTED_HITS[i] for i in c.served]  # vLLM, served that replica's share alone
        assert c.twin == c.vllm  # the twin serving it one at a time
        assert c.routed_hits == sum(c.vllm)  # the twin's routed replica, several requests in flight
        assert c.same_blocks and c.routed_blocks > 0


def test_closed_loop_clients_keep_at_most_n_requests_in_flight(server) -> None:
    run = server.serve(REQUESTS, concurrency=3)  # every request ready within half a second: clients bind
    req = run.result.requests
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    sent, done = req["arrival_s"].to_numpy(), req["completion_s"].to_numpy()
    in_flight = [((sent <= t) & (t < done)).sum() for t in sent]
    assert max(in_flight) == 3
    # one sent later than its arrival (the run records when it was sent) waited for a client: it went when
    # another completed
    late = sent > np.array([r.arrival_s for r in REQUESTS])
    assert late.any() and all((done[:, None] <= sent[late]).any(axis=0))


def test_prompt_ids_share_only_a_group_prefix() -> None:
    a, b = (prompt_token_ids(Request(i, 0.0, 300, 1, prefix_group=3, prefix_tokens=200), 4096)
            for i in (0, 1))
    assert a[:200] == b[:200] and sum(x == y for x, y in zip(a[200:], b[200:])) < 5  # chance: 1 in 4096 each
    assert min(a) >= 1 and max(a) < 4096 and len(a) == 300
    assert a == prompt_token_ids(Request(0, 5.0, 300, 9, prefix_group=3, prefix_tokens=200), 4096)
    plain = prompt_token_ids(Request(0, 0.0, 300, 1), 4096)
    assert plain != a and plain[:200] != a[:200]


def test_a_kv_capacity_is_its_whole_blocks_plus_vllms_null_block() -> None:
    d = vllm_args_for("tiny", 0, {}, kv_capacity=1000)  # blocks of 128 on the CPU
    assert d.num_gpu_blocks == 8 and engine_args(Path("m"), d)["num_gpu_blocks_override"] == 8
    assert d.max_model_len == 7 * 128  # vLLM refuses a cache that cannot hold one request of max_model_len
    assert vllm_args_for("tiny", 0, {}, kv_capacity=10**6).max_model_len == 2048
    assert vllm_args_for("tiny", 0, {"block_size": 16}, kv_capacity=1000).num_gpu_blocks == 63
    assert "num_gpu_blocks_override" not in engine_args(Path("m"), vllm_args_for("tiny", 0, {}))


def test_a_request_longer_than_the_engine_takes_is_refused_in_one_line(server) -> None:
    from simctl.common.errors import InputError

    with pytest.raises(InputError, match="max_model_len is 2048"):
        server.check([Request(0, 0.0, 2000, 100)])


@pytest.mark.slow
def test_the_cli_writes_the_run_files_to_a_relative_out(tmp_path: Path) -> None:
    res = subprocess.run([str(SIMCTL), "real", "--engine", "vllm", "--trace", "sharegpt", "--scale", "0.02",
                          "--qps", "20", "--num-requests", "12", "--max-batch-size", "8", "--out", "out/vllm",
                          "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stderr == ""  # vLLM's start-up and shutdown warnings stay off a successful run's terminal
    out = tmp_path / "out" / "vllm"
    summary = json.loads((out / "summary.json").read_text())
    assert summary == json.loads(res.stdout)
    assert summary["max_num_seqs"] == 8 and summary["completed"] == 12 and summary["engine"] == "vllm"
    req = pd.read_parquet(out / "requests.parquet")
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert pd.read_parquet(out / "iterations.parquet")["count"].sum() == summary["iterations"]
    replicas = pd.read_parquet(out / "replicas.parquet")  # one replica, as simctl's own real runs write
    assert len(replicas) == 1 and replicas["completed"].item() == 12
    assert replicas["iterations"].item() == summary["iterations"] and 0 < replicas["utilisation"].item() <= 1


@pytest.mark.parametrize("args,words", [
    (["--engine", "vllm", "--policy", "sarathi"], ["--policy sarathi: with --engine vllm", "vllm-v1"]),
    (["--engine", "vllm", "--token-budget", "64"], ["--token-budget applies only to", "not to 'vllm-v1'"]),
    (["--engine", "vllm", "--threads", "1"], ["--threads applies to --engine simctl"]),
    (["--engine", "vllm", "--enable-prefix-caching", "2"], ["--enable-prefix-caching"]),
    (["--engine", "vllm", "--scale", "1", "--num-requests", "5"], ["context of 2048"]),
    (["--engine", "tgi"], ["choose simctl or vllm"]),
    (["--engine", "vllm", "--kv-capacity", "100"], ["--kv-capacity", "one KV block (128 tokens)"]),
    (["--engine", "vllm", "--max-num-batched-tokens", "64", "--max-batch-size", "128", "--num-requests", "3"],
     ["vLLM refused its settings", "max_num_batched_tokens (64)"]),
])
def test_misuse_is_one_line_exit_2(args: list[str], words: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["real", *args])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and err.count("\n") == 1 and err.startswith("simctl: error: "), err
    assert all(w in err for w in words), err


def test_without_vllm_the_cli_says_how_to_install_it(monkeypatch, capsys) -> None:
    monkeypatch.setitem(sys.modules, "vllm", None)  # import vllm raises ImportError
    with pytest.raises(SystemExit) as exit_:
        main(["real", "--engine", "vllm", "--num-requests", "3"])
    assert exit_.value.code == 2 and capsys.readouterr().err == f"simctl: error: {INSTALL_HINT}\n"
