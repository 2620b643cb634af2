"""The real engine (engine/): the simulator's policies driving a real model give every request exactly the
greedy tokens it gets alone, and the run's records have the simulator's form."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from simctl.traces.workload import Workload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import ENGINE_MODEL, ENGINE_SEED

from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.engine.real import real_main, run_real, write_real
from simctl.engine.serve import Engine, prompt_ids
from simctl.engine.setup import RealConfig, size_run, sized_policy
from simctl.executor.plans import SlotPool
from simctl.executor.ragged import RaggedExecutor, Segment
from simctl.policies.registry import POLICIES
from simctl.results.output import write_cluster_files
from simctl.sim.run import RunConfig, run
from simctl.traces import build_trace
from simctl.traces.request import Request
from simctl.validation.twin import twin_inputs

MODEL, SEED = ENGINE_MODEL, ENGINE_SEED
SPEC = get_model(MODEL)


pytestmark = [pytest.mark.torch, pytest.mark.usefixtures("one_torch_thread")]


# Ten requests: six arrive together (a burst that batches), four a few milliseconds apart (they join running
# batches); prompts from 1 to 70 tokens, outputs from 1 to 14.
LENGTHS = [(37, 9), (5, 14), (70, 3), (1, 8), (22, 1), (48, 12), (13, 6), (64, 10), (9, 2), (30, 11)]
REQUESTS = [Request(i, 0.0 if i < 6 else 0.004 * (i - 5), p, o) for i, (p, o) in enumerate(LENGTHS)]

CASES = [(name, {}) for name in POLICIES] + [
    ("sarathi", {"token_budget": 16}),  # chunks on cached context, decodes and chunks mixed
    ("sarathi-chunked-only", {"token_budget": 24}),
    ("orca", {"max_batch_size": 3}),  # admissions wait for finishes: slots are reused
    ("prepack", {"varlen": 1}),  # attention within each packed prompt
    ("hf-padded", {"early_return": 0}),
    ("baton", {"kv_threshold": 30}),  # batch-size scaling: queries move to host and come back
]


def serve(model, policy_name: str, requests: list[Request], on_iteration=None, kv_capacity=None, **options):
    config = RealConfig(policy=policy_name, workload=Workload(trace="sharegpt", qps=1.0, num_requests=100,
                                                              seed=SEED),
                        model=MODEL, options=options, kv_capacity=kv_capacity)
    size = size_run(config, requests, SPEC.kv_bytes_per_token(4), 1 << 30)
    policy = sized_policy(config, size)
    executor = RaggedExecutor(model, size.kv_slots, size.kv_slot_tokens)
    prompts = {r.id: prompt_ids(r.id, r.prompt_tokens, SPEC.vocab_size, SEED) for r in requests}
    engine = Engine(policy, executor, prompts)
    return engine, engine.serve(requests, on_iteration=on_iteration), size


def check_run(out, requests: list[Request], alone, late: bool = False) -> None:
    """`late`: responses may return after their last token (hf-padded --early-return 0)."""
    assert not out.aborted
    by_id = {s.id: s for s in out.seqs}
    for r in requests:
        s = by_id[r.id]
        assert s.generated == r.output_tokens and len(out.tokens[r.id]) == r.output_tokens
        assert out.tokens[r.id] == alone(r), f"request {r.id}: tokens differ from its run alone"
        assert s.arrival_s <= s.first_scheduled_s <= s.first_token_s <= s.last_token_s <= s.completion_s
        assert s.last_token_s == s.completion_s or late, "a response returned after its last token"
    frame = out.iterations.frame()
    assert (frame["count"] == 1).all() and len(frame) == len(out.forward_s)
    assert (frame["start_s"].diff().dropna() > 0).all() and (frame["duration_s"] > 0).all()
    # every token but the first (and one per re-prefill after a preemption) comes from a decode row
    preemptions = sum(s.preemptions for s in out.seqs)
    assert frame["decode_tokens"].sum() == sum(r.output_tokens
                                               for r in requests) - len(requests) - preemptions


@pytest.mark.parametrize("name,options", CASES, ids=[f"{n}{'-' + '-'.join(map(str, o.values())) if o else ''}"
                                                     for n, o in CASES])
def test_every_policy_gives_each_request_its_tokens_alone(model, alone, name, options) -> None:
    engine, out, size = serve(model, name, REQUESTS, **options)
    check_run(out, REQUESTS, alone, late=options.get("early_return") == 0)
    assert out.iterations.frame()["batch_size"].max() > 1, "nothing was batched: the test proves little"
    assert out.peak_slots <= size.kv_slots and not engine.executor.slots.of, "every slot is given back"
    # requests finished below others, whose KV moved down (request-level batching frees a whole batch at once)
    assert (engine.executor.slots.moves > 0) == (not POLICIES[name].padded_batches)


def test_vllm_preemption_by_recompute_keeps_tokens(model, alone) -> None:
    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(20, 30), (18, 28), (25, 26), (16, 33)])]
    seen = []
    _, out, _ = serve(model, "vllm", requests, kv_capacity=112,  # 7 blocks of 16: two or three fit at once
                      on_iteration=lambda plan, start, end, fwd: seen.append(
                          (plan.linear_tokens, end - start, fwd)))
    assert sum(s.preemptions for s in out.seqs) > 0, "no preemption: lower the KV capacity"
    check_run(out, requests, alone)
    frame = out.iterations.frame()
    assert [t for t, _, _ in seen] == frame["linear_tokens"].tolist()
    assert all(0 < fwd <= d for _, d, fwd in seen)  # the forward is part of the iteration


def test_faster_transformer_runs_padded_batches(model, alone, monkeypatch) -> None:
    calls: list[tuple[int, int, int | None]] = []
    real_padded = RaggedExecutor.run_padded

    def spy(self, segments, length=None, kv_len=None, dense=False):
        assert not dense, "FasterTransformer's kernels are causal"
        calls.append((len(segments), max(s.q for s in segments) if length is None else length, kv_len))
        return real_padded(self, segments, length, kv_len, dense)

    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(40, 3), (7, 9), (23, 1), (15, 6)])]
    for r in requests:
        alone(r)  # before the ragged path is forbidden
    monkeypatch.setattr(RaggedExecutor, "run_padded", spy)
    monkeypatch.setattr(RaggedExecutor, "run", lambda *a, **k: pytest.fail("FasterTransformer ran ragged"))
    _, out, _ = serve(model, "faster-transformer", requests)
    check_run(out, requests, alone)
    frame = out.iterations.frame()
    assert len(calls) == len(frame)  # one padded forward per iteration
    assert calls[0][:2] == (4, 40) and frame["linear_tokens"][0] == 160 > frame["prefill_tokens"][0]
    # decodes run all four rows (finished ones too) until the longest output is done: 8 decode steps
    assert [c[0] for c in calls[1:]] == [4] * 8 and [c[2] for c in calls[1:]] == list(range(41, 49))
    assert frame["decode_tokens"].tolist()[1:] == [3, 3, 2, 2, 2, 1, 1, 1]


@pytest.mark.parametrize("name", ["baton", "baton-pd"])
def test_baton_runs_the_padded_insertion_and_the_batch_width(model, alone, monkeypatch, name) -> None:
    """The engine computes what the policy planned: baton pads every running row to the newcomer's prompt
    (B x l_new tokens), baton-pd prefills the newcomer alone; both read the batch's width of KV columns."""
    calls: list[tuple[int, int, int | None]] = []
    real_padded = RaggedExecutor.run_padded

    def spy(self, segments, length=None, kv_len=None, dense=False):
        calls.append((len(segments), max(s.q for s in segments) if length is None else length, kv_len))
        return real_padded(self, segments, length, kv_len, dense)

    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(6, 3), (4, 9), (20, 2)])]
    for r in requests:
        alone(r)  # before the ragged path is forbidden
    monkeypatch.setattr(RaggedExecutor, "run_padded", spy)
    monkeypatch.setattr(RaggedExecutor, "run", lambda *a, **k: pytest.fail("Baton ran ragged"))
    _, out, _ = serve(model, name, requests, max_batch_size=2)
    check_run(out, requests, alone)
    frame = out.iterations.frame()
    assert len(calls) == len(frame)
    # the first batch: 2 x 6 tokens; two decodes (widths 7, 8); the first query leaves after its 3rd token
    assert calls[:3] == [(2, 6, None if name == "baton-pd" else 6), (2, 1, 7), (2, 1, 8)]
    # the second query's 2 placeholder columns in front (its prompt is 4 of the 6) are trimmed: width 6
    if name == "baton":  # the 20-token prompt inserted: both rows compute 20 tokens over 6 + 20 columns
        assert calls[3] == (2, 20, 6 + 20) and frame["linear_tokens"][3] == 40
    else:  # prefilled alone, then embedded: one token per query over max(6, 20) + 1 columns
        assert calls[3] == (1, 20, None) and calls[4] == (2, 1, 21)


def test_pd_batch_whose_first_group_finishes_at_its_prefill_keeps_its_rows(model, alone) -> None:
    """pd prefills a batch in groups; a group done at its prefill (one-token outputs) must not end the batch
    in the engine before the other groups have run (regression: the decode then found too few rows)."""
    requests = [Request(i, 0.0, p, o) for i, (p, o) in enumerate([(5, 1), (30, 4), (10, 3), (7, 1)])]
    engine, out, _ = serve(model, "pd", requests, prefill_batch_size=2)
    check_run(out, requests, alone)
    frame = out.iterations.frame()
    assert (frame["linear_tokens"][frame["prefill_tokens"] == 0] == 4).all()  # decodes run all four rows
    assert not engine.executor.slots.of


@pytest.mark.parametrize("dense", [True, False], ids=["dense", "varlen"])
def test_binpacked_prefill_gives_each_prompt_its_logits_and_kv_alone(model, dense) -> None:
    """Prepacking's independent masks and restarted positions (or varlen attention over each prompt's span):
    each prompt packed with others gets the logits it gets alone, and its KV lands in its own slot at
    positions 0..q-1 (a decode from it agrees)."""
    lengths = [37, 5, 22, 48, 1, 9]
    prompts = [prompt_ids(i, n, SPEC.vocab_size, SEED) for i, n in enumerate(lengths)]
    packed = RaggedExecutor(model, len(prompts), 64)
    rows = [[0, 2], [3, 5, 4], [1]]  # 59, 58 and 5 tokens in rows of 60
    segs = [Segment(i, prompts[i], 0) for i in range(len(prompts))]
    logits = packed.run_binpacked([[segs[i] for i in row] for row in rows], 60, dense=dense)
    alone = RaggedExecutor(model, 1, 64)
    order = [i for row in rows for i in row]
    for k, i in enumerate(order):
        ref = alone.run([Segment(0, prompts[i], 0)])[0]
        torch.testing.assert_close(logits[k], ref, rtol=1e-4, atol=1e-4)
        tok = int(ref.argmax())  # a decode step reads the unpacked KV
        torch.testing.assert_close(packed.run([Segment(i, [tok], lengths[i])])[0],
                                   alone.run([Segment(0, [tok], lengths[i])])[0], rtol=1e-4, atol=1e-4)


def test_prepack_packs_and_hf_padded_masks_densely(model, alone, monkeypatch) -> None:
    calls: list[tuple[str, int, int, bool]] = []
    real_padded, real_packed = RaggedExecutor.run_padded, RaggedExecutor.run_binpacked

    def spy_padded(self, segments, length=None, kv_len=None, dense=False):
        calls.append(("padded", len(segments), len(segments), dense))
        return real_padded(self, segments, length, kv_len, dense)

    def spy_packed(self, rows, length, dense=True):
        calls.append(("packed", len(rows), sum(len(r) for r in rows), dense))
        return real_packed(self, rows, length, dense)

    requests = [Request(i, 0.0, p, o)
                for i, (p, o) in enumerate([(40, 3), (7, 9), (23, 1), (15, 6), (30, 2)])]
    for r in requests:
        alone(r)  # before the ragged path is forbidden
    monkeypatch.setattr(RaggedExecutor, "run_padded", spy_padded)
    monkeypatch.setattr(RaggedExecutor, "run_binpacked", spy_packed)
    monkeypatch.setattr(RaggedExecutor, "run",
                        lambda *a, **k: pytest.fail("a request-level policy ran ragged"))
    for name in ("prepack", "hf-padded"):
        calls.clear()
        _, out, _ = serve(model, name, requests)
        check_run(out, requests, alone)
        frame = out.iterations.frame()
        assert len(calls) == len(frame)
        if name == "prepack":  # 40 | 30 + 7 | 23 + 15: three rows of 40 for five prompts
            assert calls[0] == ("packed", 3, 5, True) and frame["linear_tokens"][0] == 3 * 40
        else:  # five rows of 40, under the padding mask
            assert calls[0] == ("padded", 5, 5, True) and frame["linear_tokens"][0] == 5 * 40
        assert all(c[0] == "padded" and c[1] == 5 for c in calls[1:])  # decodes: all five rows


def test_slot_pool_stays_packed_and_refuses() -> None:
    from simctl.policies.seq import Seq

    moves = []
    pool = SlotPool(3, lambda *m: moves.append(m))
    a, b, c, d = (Seq(i, 0.0, 4, 4) for i in range(4))
    assert (pool.get(a), pool.get(b), pool.get(c), pool.get(a)) == (0, 1, 2, 0)
    with pytest.raises(RuntimeError, match="no free KV slot"):
        pool.get(d)
    c.computed = 5
    pool.release(a)  # c (row 2, 5 positions of KV) moves into row 0
    assert moves == [(2, 0, 5)] and pool.get(c) == 0 and pool.get(d) == 2
    pool.release(d)  # the highest row: nothing moves
    assert moves == [(2, 0, 5)] and pool.peak == 3 and pool.of == {c.id: 0, b.id: 1}


def test_real_run_writes_the_simulators_files(tmp_path) -> None:
    """The whole path: child process with OMP_WAIT_POLICY=PASSIVE, scaled profile trace, output files."""
    summary = real_main(policy="vllm", workload=Workload(trace="sharegpt", qps=40.0, num_requests=8,
                                                         scale=0.02),
                        model=MODEL, threads=1, out=tmp_path / "real")
    assert summary["mode"] == "real" and summary["completed"] == 8
    assert summary["OMP_WAIT_POLICY"] == "PASSIVE" and summary["OMP_NUM_THREADS"] == "1"
    assert summary["threads"] == 1 and summary["child_process"] is True
    for key in ("device", "device_name", "dtype", "torch_version", "scale", "max_seq_len", "kv_slots"):
        assert summary[key] is not None
    assert summary["executor_config"] == {"attention": "auto", "eager": True,
                                          "attention_backends": ["flash", "math"]}
    assert summary["attention_kernels"]["decode_masked"] == "flash (folded)"
    sim = run(RunConfig(policy="vllm", workload=Workload(trace="sharegpt", num_requests=5, qps=1.0)))
    write_cluster_files(tmp_path / "sim", sim.summary, sim.result.requests, sim.iterations, sim.replicas)
    for name in ("requests.parquet", "iterations.parquet", "replicas.parquet"):
        real_frame, sim_frame = (pd.read_parquet(tmp_path / "real" / name),
                                  pd.read_parquet(tmp_path / "sim" / name))
        assert list(real_frame.columns) == list(sim_frame.columns)
        assert list(real_frame.dtypes) == list(sim_frame.dtypes)
    written = json.loads((tmp_path / "real" / "summary.json").read_text())
    assert written == summary
    not_real = {"cost_model", "cost", "cost_assumptions", "warnings", "replicas", "router", "prefill_gpu",
                "decode_gpu", "kv_link_gbps"}
    assert set(sim.summary) - not_real <= set(written)  # (options the real engine does not take)
    req = pd.read_parquet(tmp_path / "real" / "requests.parquet")
    assert (req["generated_tokens"] == req["output_tokens"]).all()
    assert (req["arrival_s"] <= req["first_scheduled_s"]).all()
    assert (req["first_scheduled_s"] <= req["first_token_s"]).all()
    assert (req["first_token_s"] <= req["completion_s"]).all()

    requests, policy = twin_inputs(written)  # the simulator's twin: same requests, same policy settings
    assert [(r.prompt_tokens, r.output_tokens) for r in requests] == list(
        zip(req["prompt_tokens"], req["output_tokens"]))
    assert (policy.kv.capacity == written["kv_capacity_tokens"]
            and policy.max_batch_size == written["max_batch_size"])


def test_run_real_in_process_and_scale(tmp_path) -> None:
    r = run_real(RealConfig(policy="sarathi", workload=Workload(trace="arxiv", qps=50.0, num_requests=4,
                                                                scale=0.01),
                            model=MODEL, threads=1, options={"token_budget": 64}))
    assert r.summary["completed"] == 4 and r.summary["token_budget"] == 64 and r.summary["scale"] == 0.01
    full = build_trace("arxiv", 4, 50.0, 0)
    assert [(q.prompt_tokens, q.output_tokens) for q in r.requests] == [
        (max(1, math.floor(q.prompt_tokens * 0.01 + 0.5)), max(1, math.floor(q.output_tokens * 0.01 + 0.5)))
        for q in full]
    write_real(r, tmp_path)
    assert {p.name for p in tmp_path.iterdir()} == {"summary.json", "requests.parquet", "iterations.parquet",
                                                    "replicas.parquet"}


@pytest.mark.parametrize("workload,options,match", [
    ({"scale": 0}, {}, "--scale"),
    ({"scale": 1.0, "trace": "arxiv"}, {}, "positions"),  # long requests on a 2048-position model
    ({}, {"device": "tpu"}, "--device"),
    ({}, {"dtype": "int8"}, "--dtype"),
    ({}, {"kv_capacity": 16}, "KV cache"),
])
def test_real_main_input_errors(workload, options, match, tmp_path) -> None:
    given = Workload(**{"trace": "sharegpt", "qps": None, "num_requests": 50, "scale": 0.02, **workload})
    with pytest.raises(InputError, match=match):
        real_main(policy="vllm", workload=given, model=MODEL, **options, out=tmp_path / "x")
    assert not (tmp_path / "x").exists()

