"""CUDA-graph decode steps (`costs.graph_buckets`, `executor.cuda_graphs`): the buckets a step is padded to,
a fitted model pricing the padded step and a graphed profile recording it, and the graph's padded
computation giving every row the logits its eager step gives (on the CPU the graph's forward runs uncaptured;
the capture itself in the tests that skip without CUDA)."""

from __future__ import annotations

import gc
import random
import weakref

import numpy as np
import pytest

from simctl.costs.fitted import Fitted
from simctl.costs.graph_buckets import CAPTURE_SIZES, GraphShapes
from simctl.policies.plan import Layout, hybrid, padded_decode
from simctl.policies.seq import Seq
from simctl.profiler.shape_protocol import SERVED
from simctl.profiler.shapes import decode, prefill
from simctl.profiler.shapes import hybrid as hybrid_shape
from simctl.profiler.workloads import build_grid
from simctl.traces.workload import Workload


def decoding(i: int, context: int) -> Seq:
    s = Seq(i, 0.0, context, 10 ** 6)
    s.advance(context)
    s.advance(1)
    s.computed = context
    return s


def test_capture_sizes_and_buckets():
    assert CAPTURE_SIZES[:5] == (1, 2, 4, 8, 16) and CAPTURE_SIZES[-1] == 512 and len(CAPTURE_SIZES) == 67
    g = GraphShapes()
    assert [g.rows(n) for n in (1, 2, 3, 5, 8, 9, 17, 505, 512)] == [1, 2, 4, 8, 8, 16, 24, 512, 512]
    assert g.rows(513) is None  # beyond the largest graph: eager
    assert GraphShapes(20).rows(17) == 20 and GraphShapes(20).rows(21) is None  # the slots: the last bucket
    assert (g.kv(1), g.kv(256), g.kv(257)) == (256, 256, 512)
    assert list(g.kv(np.array([255, 256, 257, 513]))) == [256, 256, 512, 768]
    with pytest.raises(ValueError):
        GraphShapes(0)


def test_a_decode_step_is_executed_padded_to_its_graph():
    seqs = [decoding(i, c) for i, c in enumerate([10, 300, 20, 5, 7])]
    plan = hybrid(seqs, [], [])
    run = GraphShapes().executed(plan)
    assert run == padded_decode(seqs, 8, 512)  # 5 rows -> 8, longest 301 KV tokens -> 512
    assert (run.linear_tokens, run.sampled_tokens, run.decode_rows, run.decode_kv, run.idle_rows) == (
        8, 8, 8, 8 * 512, 3)
    assert run.decode_tokens == 5 and run.layout is Layout.PADDED
    chunked = hybrid(seqs[:2], [Seq(9, 0.0, 40, 5)], [16])
    assert GraphShapes().executed(chunked) is chunked  # a step with a prefill runs eager
    assert GraphShapes(4).executed(plan) is plan  # more rows than the graphs hold
    last = Seq(9, 0.0, 41, 5)
    last.computed = 40  # a prompt's last token as a 1-token chunk: computed as a decode row is
    assert GraphShapes().executed(hybrid(seqs, [last], [1])) == padded_decode(seqs + [last], 8, 512)
    one = hybrid([], [Seq(9, 0.0, 1, 5)], [1])  # a 1-token prompt: nothing cached, a prefill kernel
    assert GraphShapes().executed(one) is one


EAGER_STEP_S = 5e-3


@pytest.fixture(scope="module")
def fits() -> tuple[Fitted, Fitted]:
    """The same coefficients without graphs (a file from before `eager_step_s`: it prices at 0) and with
    them."""
    coef = {"overhead_s": 2e-3, "attn_unit_s": 2e-9, "attn_kv_token_s": 1e-6, "attn_segment_s": 5e-5,
            "decode_pad_token_s": 3e-8, "decode_row_s": 2e-5}
    curves = {"linear": [(1, 0.0), (64, 1e-3), (512, 6e-3)], "lm_head": [(0, 0.0), (1, 1e-4), (512, 3e-3)],
              "decode_kv": [(16, 0.0), (1024, 1e-4), (4096, 5e-4)]}
    config = {"attention": "auto", "eager": False, "cuda_graphs": GraphShapes().to_json()}
    return (Fitted(coef, 64, curves),
            Fitted({**coef, "eager_step_s": EAGER_STEP_S}, 64, curves, meta={"executor_config": config}))


def test_a_graphed_fit_prices_decode_steps_as_their_graphs_run(fits):
    eager, graphed = fits
    assert eager.graphs is None and graphed.graphs == GraphShapes()
    seqs = [decoding(i, c) for i, c in enumerate([100, 700, 90])]
    plan = hybrid(seqs, [], [])
    assert graphed.iteration_time(plan) == eager.iteration_time(padded_decode(seqs, 4, 768))
    assert graphed.iteration_time(plan) > eager.iteration_time(plan)  # padding is work
    mixed = hybrid(seqs, [Seq(7, 0.0, 50, 5)], [50])  # runs eager beside the graphs
    assert graphed.iteration_time(mixed) == pytest.approx(eager.iteration_time(mixed) + EAGER_STEP_S)
    assert graphed.stretch_times(mixed, 1)[0] == pytest.approx(graphed.iteration_time(mixed))
    assert graphed.breakdown(plan) == {**eager.breakdown(padded_decode(seqs, 4, 768)), "eager_step": 0.0}
    assert graphed.breakdown(mixed)["eager_step"] == EAGER_STEP_S


def test_a_graphed_decode_stretch_prices_each_step_as_its_graph(fits):
    """Repeat j of a stretch is the step with every row j tokens further: across KV-block boundaries the
    closed form equals pricing each step alone."""
    _, graphed = fits
    rng = random.Random(3)
    for _ in range(20):
        contexts = [rng.randrange(1, 900) for _ in range(rng.randrange(1, 40))]
        seqs = [decoding(i, c) for i, c in enumerate(contexts)]
        k = rng.randrange(1, 600)
        times = graphed.stretch_times(hybrid(seqs, [], []), k)
        for j in sorted({0, k - 1, rng.randrange(k)}):
            later = [decoding(i, c + j) for i, c in enumerate(contexts)]
            assert times[j] == pytest.approx(graphed.iteration_time(hybrid(later, [], [])), rel=1e-12)


def test_a_graphed_profile_records_decode_steps_as_run_and_repeats_them():
    g = GraphShapes()
    f = decode(5, 300).features(g)
    assert (f["kind"], f["decode_rows"], f["linear_tokens"], f["decode_kv"], f["decode_pad_kv"],
            f["eager_step"]) == ("decode", 8, 8, 8 * 512, 0, 0)
    assert decode(5, 300).features()["eager_step"] == 0  # an eager executor: no eager step beside graphs
    for shape in (prefill(64), hybrid_shape(4, 128, 32, 0)):
        assert shape.features(g) == {**shape.features(), "eager_step": 1}
    grid = build_grid("quick", 2048, None, 0, SERVED, None, g)
    reps = {r.shape.label(): r for r in grid.repetitions()}
    eager = {r.shape.label(): r for r in build_grid("quick", 2048, None, 0, SERVED).repetitions()}
    for label, r in reps.items():
        if r.shape.kind == "decode":  # one graph, one shape: every call the same
            assert (r.radius, r.spare_slots) == (0, 0) and eager[label].radius > 0
        else:
            assert r == eager[label]


def test_graphs_are_the_default_on_a_gpu_but_for_a_mixture_of_experts():
    from simctl.executor.config import eager_on

    assert eager_on("cuda:0") is False and eager_on("cpu") is True
    assert eager_on("cuda", None, moe=True) is True and eager_on("cuda", False, moe=True) is False
    assert eager_on("cuda", True) is True


def test_a_graphed_profile_fits_the_eager_steps_own_cost(tmp_path):
    """Synthetic profile rows of an executor replaying decode graphs, its eager steps 4 ms dearer: the fit
    recovers that term and prices the profile's steps exactly; an eager profile has no such term."""
    from tests.test_fit import TRUTH, design, fit_profile, synth_times, write_profile

    df = design()
    df["eager_step"] = (df["kind"] != "decode").astype(int)
    truth = {**TRUTH, "eager_step_s": 4e-3}
    report = fit_profile(write_profile(tmp_path / "graphed", df, synth_times(df, truth)), plot=False)
    assert report.coefficients["eager_step_s"] == pytest.approx(4e-3, rel=1e-3)
    assert report.holdout["overall"].mape < 1e-3
    eager = design()
    report = fit_profile(write_profile(tmp_path / "eager", eager, synth_times(eager)), plot=False)
    assert report.coefficients["eager_step_s"] == 0 and "eager_step_s" not in report.not_covered


# ---- the executor ------------------------------------------------------------------------------------------
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from simctl.catalogue.models import get_model
from simctl.executor.config import ExecutorConfig
from simctl.executor.cuda_graphs import DecodeGraphs
from simctl.executor.model import build_model
from simctl.executor.ragged import RaggedExecutor, Segment

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


def check_graph_steps(ex: RaggedExecutor, graphs: DecodeGraphs, seed: int, steps: int, tol: float) -> None:
    """Random decode steps over prefilled slots: the graph's logits equal the eager step's for every row,
    and slots that do not decode this step keep their KV (padding rows write into the scratch row)."""
    rng = random.Random(seed)
    slots = graphs.shapes.max_rows
    contexts = [rng.randrange(2, 40) for _ in range(slots)]
    for s, c in enumerate(contexts):
        ex.run([Segment(s, [rng.randrange(100) for _ in range(c)])])
    for _ in range(steps):
        live = sorted(rng.sample(range(slots), rng.randrange(1, slots + 1)))
        segs = [Segment(s, [rng.randrange(100)], contexts[s]) for s in live]
        want = ex.run(segs).float()
        idle = [s for s in range(slots) if s not in live]
        before = ex.kv[:, :, idle].clone()
        got = graphs.run(segs, graphs.bucket(segs)).float()
        assert (got - want).abs().max().item() <= tol * want.abs().max().item()
        assert torch.equal(ex.kv[:, :, idle], before)
        for s in live:
            contexts[s] += 1


@pytest.mark.torch
@pytest.mark.parametrize("seed", range(3))
def test_graph_steps_give_every_row_its_eager_logits_on_the_cpu(seed):
    model = build_model(get_model("tiny-2l"), "cpu", "float32", seed=0)
    slots = 6
    ex = RaggedExecutor(model, slots + 1, 256)  # the last row: the graphs' scratch row
    graphs = DecodeGraphs(ex, GraphShapes(slots, kv_block=16), scratch=slots)
    check_graph_steps(ex, graphs, seed, 12, 1e-5)
    assert {rows for rows, _ in graphs.graphs} <= {1, 2, 4, 6}
    assert graphs.bucket([Segment(0, [5], 0)]) is None  # a 1-token prompt runs eager
    assert graphs.bucket([Segment(0, [5], 3), Segment(1, [6, 7], 3)]) is None  # a chunk of two


@pytest.mark.torch
def test_an_executor_with_graphs_is_freed_without_the_collector():
    # a profile builds an executor (and its KV slab) per shape: a graphs <-> executor cycle kept every slab
    # until the collector ran, and llama-2-7b's profile ran an 80 GB H100 out of memory (issue 41)
    model = build_model(get_model("tiny-2l"), "cpu", "float32", seed=0)
    ex = RaggedExecutor(model, 3, 64)
    ex.graphs = DecodeGraphs(ex, GraphShapes(2, kv_block=16), scratch=2)
    check_graph_steps(ex, ex.graphs, 0, 2, 1e-5)  # graphs made, each closing over the executor
    gone = weakref.ref(ex)
    gc.disable()
    try:
        del ex
        assert gone() is None
    finally:
        gc.enable()


@pytest.mark.torch
@needs_cuda
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_graph_steps_give_every_row_its_eager_logits(dtype):
    model = build_model(get_model("tiny"), "cuda", dtype, seed=0)
    slots = 12
    eager = RaggedExecutor(model, slots + 1, 256)
    graphs = DecodeGraphs(eager, GraphShapes(slots, kv_block=16), scratch=slots)
    assert graphs.capture
    check_graph_steps(eager, graphs, 0, 20, 1e-4 if dtype == "float32" else 3e-2)
    assert all(g.graph is not None for g in graphs.graphs.values())


@pytest.mark.torch
@needs_cuda
def test_cuda_graphed_executor_runs_decodes_from_graphs_and_captures_them_all():
    model = build_model(get_model("tiny"), "cuda", "bfloat16", seed=0)
    ex = RaggedExecutor(model, 10, 300, ExecutorConfig(eager=False))
    assert ex.graphs is not None
    assert ex.kv.shape[2] == 11 and ex.kv.shape[4] == 512  # a scratch row, whole KV blocks
    ex.run([Segment(0, [1] * 20), Segment(1, [2] * 30)])
    first = ex.run([Segment(0, [3], 20), Segment(1, [4], 30)])
    assert set(ex.graphs.graphs) == {(2, 256)} and first.shape[0] == 2
    ex.graphs.capture_all()
    assert set(ex.graphs.graphs) == {(b, k) for b in (1, 2, 4, 8, 10) for k in (256, 512)}



@pytest.mark.torch
@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("name,options", [("vllm", {}), ("sarathi", {"token_budget": 16}),
                                          ("orca", {"max_batch_size": 3})])
def test_an_engine_whose_decodes_run_as_graphs_gives_each_request_its_tokens_alone(model, alone, name,
                                                                                    options):
    """The real engine with its decode steps run through the graphs' padded computation (uncaptured on the
    CPU; every graph captured first, as a GPU engine does): each request gets exactly the tokens it gets
    alone, slots that come and go (finished requests' KV moved down) included, and decode steps did run
    from graphs."""
    from conftest import ENGINE_MODEL, ENGINE_SEED

    from simctl.engine.serve import Engine, prompt_ids, warm_up
    from simctl.engine.setup import RealConfig, size_run, sized_policy
    from tests.test_engine import REQUESTS

    spec = get_model(ENGINE_MODEL)
    config = RealConfig(policy=name, workload=Workload(trace="sharegpt", qps=1.0, num_requests=100,
                                                       seed=ENGINE_SEED), model=ENGINE_MODEL, options=options)
    size = size_run(config, REQUESTS, spec.kv_bytes_per_token(4), 1 << 30)
    shapes = GraphShapes(size.kv_slots, kv_block=16)
    ex = RaggedExecutor(model, size.kv_slots + 1, shapes.kv(size.kv_slot_tokens))  # + the scratch row
    ex.graphs = DecodeGraphs(ex, shapes, scratch=size.kv_slots)
    warm_up(ex, spec.vocab_size)
    captured = len(ex.graphs.graphs)
    assert captured == len({shapes.rows(n) for n in range(1, size.kv_slots + 1)}) * (ex.max_len // 16)
    priced, replays = [], []  # each step's graph as priced before it runs, and the graphs replayed
    replay = ex.graphs.run
    ex.graphs.run = lambda segments, key: replays.append(key) or replay(segments, key)
    prompts = {r.id: prompt_ids(r.id, r.prompt_tokens, spec.vocab_size, ENGINE_SEED) for r in REQUESTS}
    engine = Engine(sized_policy(config, size), ex, prompts)
    execute = engine.executor.execute

    def noted(plan):
        run = shapes.executed(plan)
        if run is not plan:
            priced.append((run.rows, run.kv_len))
        return execute(plan)

    engine.executor.execute = noted
    out = engine.serve(REQUESTS)
    assert not out.aborted
    for r in REQUESTS:
        assert out.tokens[r.id] == alone(r), f"request {r.id}: tokens differ from its run alone"
    assert priced and replays == priced  # every step priced as graphed ran from that graph, and no other
    assert len(ex.graphs.graphs) == captured  # nothing captured while serving
