"""The profiler's executor computes what the model computes, and a profile is well formed.

Correctness is checked against transformers' own SDPA attention on the same weights (2-layer tiny model,
fp32, to 1e-5 on logits of magnitude ~1): packed prompts, chunked prefill on cached context, hybrid batches,
padded batches, decode rows with mixed contexts. Each test also checks a wrong computation is far off, so the
tolerance is not vacuous.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pandas as pd
import pytest
from conftest import cpu_seconds, wait_until

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from simctl.catalogue.models import get_model
from simctl.common.errors import InputError
from simctl.executor.model import build_model, reference_model
from simctl.executor.ragged import RaggedExecutor, Segment
from simctl.profiler.profile import profile
from simctl.profiler.shapes import (
    COLUMNS,
    KINDS,
    binpacked_prompts,
    decode,
    decode_mixed,
    hybrid,
    padded_decode,
    padded_insertion,
)
from simctl.profiler.sweeps import Block, select_blocks, summarise_blocks
from simctl.profiler.timing import CpuMonitor, summarise_times, time_fn
from simctl.profiler.workloads import build_grid

pytestmark = pytest.mark.torch

ATOL = 1e-5
WRONG = 1e-2  # a wrong mask or cache moves logits by far more than this


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    spec = get_model("tiny-2l")
    model = build_model(spec, "cpu", "float32", seed=0)
    return spec, model, reference_model(model)


@pytest.fixture(scope="module")
def prompts(models):
    spec = models[0]
    g = torch.Generator().manual_seed(1)
    return [torch.randint(0, spec.vocab_size, (n,), generator=g) for n in (7, 33, 1, 60, 18)]


def ref_logits(ref, tokens):
    """Logits of every position of `tokens` run alone through transformers' own model."""
    with torch.inference_mode():
        return ref(input_ids=tokens[None], use_cache=False).logits[0]


def close(a, b) -> float:
    return float((a - b).abs().max())


def test_packed_prompts_match_separate_runs(models, prompts):
    _, model, ref = models
    expect = torch.stack([ref_logits(ref, p)[-1] for p in prompts])
    ex = RaggedExecutor(model, 8, 128)
    packed = ex.run([Segment(i, p) for i, p in enumerate(prompts)])
    assert packed.shape == expect.shape
    assert close(packed, expect) < ATOL
    # each prompt alone through the executor agrees too
    alone = torch.cat([RaggedExecutor(model, 1, 64).run([Segment(0, p)]) for p in prompts])
    assert close(alone, expect) < ATOL
    # not vacuous: different prompts give clearly different logits
    assert close(expect[0], expect[1]) > WRONG


def test_chunked_prefill_on_cached_context_matches_one_shot(models, prompts):
    _, model, ref = models
    p = prompts[3]  # 60 tokens: chunks of 25, 20 and 15
    expect = ref_logits(ref, p)[-1]
    ex = RaggedExecutor(model, 2, 64)
    assert ex.run([Segment(0, p[:25], 0, sample=False)]).shape[0] == 0  # mid-prompt: nothing sampled
    mid = ex.run([Segment(0, p[25:45], 25)])
    assert close(mid[0], ref_logits(ref, p[:45])[-1]) < ATOL
    last = ex.run([Segment(0, p[45:], 45)])
    assert close(last[0], expect) < ATOL
    # a chunk that ignores its cache (restarted positions, no context) is far off
    wrong = ex.run([Segment(1, p[45:], 0)])
    assert close(wrong[0], expect) > WRONG


def test_hybrid_iteration_gives_each_request_its_own_logits(models, prompts):
    _, model, ref = models
    a, b, long_p = prompts[0], prompts[1], prompts[3]
    ex = RaggedExecutor(model, 4, 64)
    # iteration 1: prefill a and b without their last token, and the first 30 tokens of long_p
    ex.run([Segment(0, a[:-1]), Segment(1, b[:-1]), Segment(2, long_p[:30], sample=False)])
    # iteration 2: two decodes (the last prompt token stands in for a sampled one) + a chunk on 30 cached
    out = ex.run([Segment(0, a[-1:], len(a) - 1), Segment(1, b[-1:], len(b) - 1),
                  Segment(2, long_p[30:], 30)])
    expect = torch.stack([ref_logits(ref, a)[-1], ref_logits(ref, b)[-1], ref_logits(ref, long_p)[-1]])
    assert close(out, expect) < ATOL


def test_decode_rows_with_mixed_contexts_and_scattered_slots(models):
    spec, model, ref = models
    # contexts 0..200 over slots 0..6 out of order: one masked view of slab rows 0..6; slot 4 is a hole in the
    # span that holds a prompt prefilled in the same iteration (its zero query's output must not leak)
    g = torch.Generator().manual_seed(2)
    lengths = {5: 201, 1: 1, 3: 91, 0: 30, 6: 150, 2: 7}
    order = [(slot, torch.randint(0, spec.vocab_size, (n,), generator=g)) for slot, n in lengths.items()]
    other = torch.randint(0, spec.vocab_size, (40,), generator=g)
    ex = RaggedExecutor(model, 8, 256)
    decodes = [Segment(slot, p[-1:], len(p) - 1) for slot, p in order]
    kwargs, _ = ex.prepare(decodes)
    d = kwargs["simctl_batch"].decodes
    assert (d.slots, d.kmax) == (slice(0, 7), 201) and d.mask is not None
    assert d.rows.tolist() == [0, 1, 2, 3, 5, 6]
    ex.run([Segment(slot, p[:-1]) for slot, p in order if len(p) > 1])
    out = ex.run(decodes + [Segment(4, other)])
    expect = torch.stack([ref_logits(ref, p)[-1] for _, p in order] + [ref_logits(ref, other)[-1]])
    assert close(out, expect) < ATOL
    # a wrong mask (every row sees the longest context) is far off
    wrong = ex.run([Segment(slot, p[-1:], 200) for slot, p in order if len(p) < 201])
    assert close(wrong, expect[1:6]) > WRONG


def test_padded_batch_matches_unpadded(models, prompts):
    _, model, ref = models
    expect = torch.stack([ref_logits(ref, p)[-1] for p in prompts])
    ex = RaggedExecutor(model, 8, 128)
    assert close(ex.run_padded([Segment(i, p) for i, p in enumerate(prompts)]), expect) < ATOL
    # longer than needed rows, then a padded decode step reading more KV columns than any row holds
    ex = RaggedExecutor(model, 8, 128)
    ex.run_padded([Segment(i, p[:-1]) for i, p in enumerate(prompts) if len(p) > 1], length=70)
    dec = [Segment(i, p[-1:], len(p) - 1) for i, p in enumerate(prompts) if len(p) > 1]
    got = ex.run_padded(dec, kv_len=100)
    assert close(got, expect[[i for i, p in enumerate(prompts) if len(p) > 1]]) < ATOL


def test_executor_rejects_bad_segments(models):
    _, model, _ = models
    ex = RaggedExecutor(model, 2, 16)
    with pytest.raises(ValueError):
        ex.run([Segment(2, [1, 2])])  # no such slot
    with pytest.raises(ValueError):
        ex.run([Segment(0, [1]), Segment(0, [2])])  # one slot twice
    with pytest.raises(ValueError):
        ex.run([Segment(0, [1, 2], 15)])  # past max_len
    with pytest.raises(ValueError):
        RaggedExecutor(reference_model(model), 1, 8)  # not the ragged attention


def test_every_profiled_shape_is_a_plan_with_its_execution_shape():
    """Each shape of the full grid is built by the policies' plan builders (its features come from that plan),
    and the plan executes exactly the shape the profiler times."""
    grid = build_grid("full", 2048)
    assert {s.kind for s in grid.shapes} == set(KINDS)
    for shape in grid.shapes:
        plan = shape.plan()
        assert plan.rows == len(shape.segs), shape.label()
        if shape.kind == "padded_prefill":
            assert plan.row_len == shape.length and plan.linear_tokens == len(shape.segs) * shape.length
            assert plan.dense_attention == shape.dense
        elif shape.kind == "binpacked_prefill":
            assert plan.bins == [list(b)
                                 for b in shape.bins] and plan.linear_tokens == len(shape.bins) * shape.length
        elif shape.kind == "padded_insertion":  # every row computes the newcomer's L tokens over the width
            assert plan.linear_tokens == len(shape.segs) * shape.length and plan.kv_len == shape.kv_len
            assert plan.num_new == [s.q for s in shape.segs] and plan.dense_attention
        elif shape.kind == "padded_decode":
            assert plan.row_len == 1 and plan.kv_len == shape.kv_len
        else:
            ordered = [s for s in shape.segs if s.decode] + [s for s in shape.segs if not s.decode]
            assert plan.sampling() == [s.sample for s in ordered], shape.label()
            assert plan.num_new == [s.q for s in ordered]


def test_shape_features_by_hand():
    f = hybrid(3, 100, 64, 1000).features()  # 3 decodes at context 100 + a mid-prompt chunk of 64 on 1000
    assert f == {"kind": "hybrid", "batch_size": 4, "linear_tokens": 67, "sampled_tokens": 3,
                 "num_segments": 1, "attn_units": 64 * (1000 + 32), "attn_kv_tokens": 1064, "decode_rows": 3,
                 "decode_kv": 303, "decode_pad_kv": 0, "eager_step": 0, "q": 64, "c": 1000}
    f = padded_decode([10, 40], kv_len=50).features()
    assert (f["decode_rows"], f["decode_kv"], f["decode_pad_kv"], f["c"]) == (2, 100, 0, 49)
    f = decode_mixed([10, 40]).features()  # ragged: padding to the longest row (41) counted apart
    assert (f["decode_kv"], f["decode_pad_kv"]) == (11 + 41, 2 * 41 - 52)
    # 2 running rows + a 50-token prompt on a 100-wide batch
    f = padded_insertion([30, 90], 50, 100).features()
    assert (f["linear_tokens"], f["num_segments"], f["attn_units"], f["q"],
            f["c"]) == (150, 3, 3 * 50 * 150, 50, 100)
    f = binpacked_prompts([60, 30, 25, 5]).features()  # rows [60] and [30, 25, 5]: two dense 60 x 60 blocks
    assert (f["linear_tokens"], f["sampled_tokens"], f["attn_units"]) == (120, 4, 2 * 60 * 60)


def test_time_fn_and_summary():
    calls = []
    times = time_fn(lambda: calls.append(1), warmup=2, reps=5, device="cpu")
    assert len(calls) == 7 and len(times) == 5 and all(t >= 0 for t in times)
    s = summarise_times([3.0, 1.0, 2.0])
    assert s["time_s"] == 2.0 and s["time_mean_s"] == 2.0 and s["time_p10_s"] <= 2.0 <= s["time_p90_s"]
    # skewed to the slow side, as a busy machine's calls are: the estimate is the median, the mean beside it
    s = summarise_times([1.0, 1.0, 1.0, 5.0])
    assert s["time_s"] == 1.0 and s["time_mean_s"] == 2.0


def test_summarize_blocks_takes_the_quiet_blocks():
    quiet = [Block([1.0, 1.0, 4.0], 0.0, True), Block([1.0, 3.0], 0.01, True)]
    busy = Block([50.0, 60.0], 0.5, False)  # contended: left out
    grid = SimpleNamespace(shapes=[decode(2, 8)], quiet_blocks=1)
    rows, timing = summarise_blocks([quiet + [busy]], grid, SimpleNamespace(available=True))
    assert rows[0]["reps"] == 5 and rows[0]["time_s"] == 1.0 and rows[0]["time_mean_s"] == 2.0
    assert timing["estimator"].startswith("median") and timing["quiet_blocks"] == 2


def test_profile_writes_a_well_formed_profile(tiny_profile):
    out = tiny_profile
    frame = pd.read_csv(out / "profile.csv")
    assert list(frame.columns) == list(COLUMNS)
    assert set(frame["kind"]) == set(KINDS)
    assert not frame.isna().any().any()
    assert (frame["time_s"] > 0).all() and (frame["reps"] >= 1).all()
    assert (frame["time_p10_s"] <= frame["time_s"]).all() and (frame["time_s"] <= frame["time_p90_s"]).all()
    assert (frame["time_mean_s"] > 0).all()
    padded = frame[frame["kind"] == "padded_prefill"].iloc[0]
    packed = frame[(frame["kind"] == "prefill") & (frame["num_segments"] == padded["num_segments"])].iloc[0]
    assert padded["linear_tokens"] >= packed["linear_tokens"]  # pads are computed
    meta = json.loads((out / "meta.json").read_text())
    assert meta["OMP_WAIT_POLICY"] == "PASSIVE" and meta["threads"] == 1
    assert (meta["executor_config"]["attention"] == "auto"
            and meta["attention_kernels"]["decode"] == "flash (folded)")
    timing = meta["timing"]
    assert timing["blocks"] >= len(frame) and 0 <= timing["quiet_blocks"] <= timing["blocks"]
    assert 0 <= timing["foreign_cpu_share"] <= 1 and isinstance(timing["shapes_without_quiet_block"], list)
    assert (meta["model"] == "tiny-2l" and meta["model_shape"]["num_layers"] == 2
            and meta["dtype"] == "float32")
    for key in ("device_name", "torch_version", "transformers_version", "date"):
        assert meta[key]
    spec = get_model("tiny-2l")
    assert meta["kv_bytes_per_token"] == spec.kv_bytes_per_token(4) == 2 * 2 * 2 * 64 * 4
    assert not list(out.glob(".*.tmp"))  # no temporary files left behind


@pytest.mark.parametrize("kwargs, message", [
    ({"model_name": "no-such-model"}, "unknown model"),
    ({"dtype": "float64"}, "dtype"),
    ({"device": "tpu"}, "device"),
    ({"threads": 0}, "threads"),
    ({"model_name": "falcon-180b"}, "gated"),
    ({"model_name": "llama-2-70b"}, "llama-2-70b in float32 needs .* GB available"),
])
def test_bad_inputs_raise_input_error(tmp_path, kwargs, message):
    args = {"model_name": "tiny-2l", "device": "cpu", "dtype": "float32", "threads": 1, "quick": True,
            "out_dir": tmp_path / "p", "progress": False, "grid": "test", **kwargs}
    with pytest.raises(InputError, match=message):
        profile(**args)
    assert not (tmp_path / "p").exists()


def test_cuda_unavailable_and_out_dir_a_file(tmp_path):
    if not torch.cuda.is_available():
        with pytest.raises(InputError, match="cuda requested but not available"):
            profile("tiny-2l", "cuda", "float32", 1, True, tmp_path / "p", progress=False, grid="test")
    f = tmp_path / "file"
    f.write_text("x")
    with pytest.raises(InputError, match="not a directory"):
        profile("tiny-2l", "cpu", "float32", 1, True, f, progress=False, grid="test")


def test_grids_fit_memory_and_positions():
    for name in ("full", "quick", "test"):
        grid = build_grid(name, 2048, max_kv_tokens=2 ** 17)
        assert grid.shapes
        assert all(s.max_len <= 2048 and s.kv_tokens <= 2 ** 17 for s in grid.shapes)
    small = build_grid("full", 300)
    assert all(s.max_len <= 300 for s in small.shapes)
    full = build_grid("full", 2048)
    ts = {s.segs[0].q for s in full.shapes if s.kind == "prefill" and len(s.segs) == 1 and s.segs[0].c == 0}
    for k in range(4, 12):  # tile boundaries
        assert {2 ** k - 1, 2 ** k} <= ts and (2 ** k + 1 in ts or 2 ** k + 1 > 2048)
    s = summarise_times([1.0, 2.0, 10.0])  # the estimate is the median; the mean beside it
    assert math.isclose(s["time_s"], 2.0) and math.isclose(s["time_mean_s"], 13.0 / 3)


def test_full_grid_separates_what_the_fit_needs():
    """Unsampled chunks (the LM head's first row vs the overhead), single prompts at every decode batch size
    (the linear curve pinned where decode rows sample every row), long iterations up to 8192 tokens, and
    timing limits that keep the full profile under 5 minutes and the quick one under 1."""
    full = build_grid("full", 2048)
    rows = [s.features() for s in full.shapes]
    assert sum(1 for f in rows if f["sampled_tokens"] == 0) >= 4
    single = {f["linear_tokens"] for f, s in zip(rows, full.shapes) if s.kind == "prefill"
              and len(s.segs) == 1}
    assert {f["batch_size"] for f in rows if f["kind"] == "decode"} <= single
    assert {3072, 4096, 6144, 8192} <= {f["linear_tokens"] for f in rows}
    assert full.passes >= 8 and full.quiet_blocks >= 1 and full.max_wall_s <= 285
    quick = build_grid("quick", 2048)
    assert quick.max_wall_s <= 50 and any(s.features()["sampled_tokens"] == 0 for s in quick.shapes)
    assert build_grid("test", 2048).quiet_blocks == 0  # the test grid never waits for an idle machine


@pytest.fixture
def spinning() -> Iterator[int]:
    """A child process spinning on a core (its pid), started and killed around the test."""
    if not Path("/proc/self/stat").exists():
        pytest.skip("no /proc")
    child = subprocess.Popen([sys.executable, "-c", "while True: pass\n"])
    try:
        wait_until(lambda: cpu_seconds(child.pid) >= 0.05, "the child is spinning")
        yield child.pid
    finally:
        child.kill()
        child.wait()


def _spin(pid: int, cpu_s: float) -> None:
    """Wait until the spinning child has used `cpu_s` more CPU seconds (its state, not a fixed time)."""
    start = cpu_seconds(pid)
    wait_until(lambda: cpu_seconds(pid) >= start + cpu_s, f"the child spun {cpu_s} CPU seconds")


def test_cpu_monitor_sees_another_process(spinning: int):
    mon = CpuMonitor()
    r0, w0 = mon.read(), time.perf_counter()
    _spin(spinning, 0.4)
    wall, r1 = time.perf_counter() - w0, mon.read()
    # a whole core busy for the block: at least 1 / cpus of the capacity (less a tick or two of sampling); on
    # a loaded machine the block lasts longer, and the rest of the machine fills it
    assert mon.foreign_share(r0, r1, wall) > 0.6 / mon.cpus
    assert not mon.quiet(r0, r1, wall, 0.05)
    assert mon.foreign_ticks(r1, r1) == 0 and mon.quiet(r1, r1, 0.1, 0.05)
    # a whole tick in a block shorter than a tick is a share of at most 1, not 1 / (hz x cpus x wall)
    assert mon.foreign_share((0, 0), (2, 0), 0.5 / mon.hz) == 1.0


def test_cpu_monitor_counts_the_processes_it_owns_as_its_own(spinning: int):
    """0.4 CPU seconds of a spinning child: foreign to a monitor of this process, its own to one that owns it
    (a vLLM profile's model worker): their foreign ticks differ by the child's ticks."""
    mon, owner = CpuMonitor(), CpuMonitor(own=(spinning,))
    a0, b0 = mon.read(), owner.read()
    _spin(spinning, 0.4)
    a1, b1 = mon.read(), owner.read()
    owner.close()
    assert mon.foreign_ticks(a0, a1) - owner.foreign_ticks(b0, b1) >= 0.3 * mon.hz


def test_blocks_timed_on_a_busy_machine_are_not_used():
    def block(ms: float, quiet: bool, foreign: float = 0.0) -> Block:
        return Block([ms * 1e-3] * 3, foreign if not quiet else 0.0, quiet)

    # every quiet block, slow ones too (a served workload meets them as well); contended ones ignored
    bs = [block(10, True), block(6, False, 0.5), block(12, True), block(11, True), block(30, False, 0.4),
          block(10.5, True)]
    assert sorted(b.times[0] * 1e3 for b in select_blocks(bs)) == [10, 10.5, 11, 12]
    assert len(select_blocks([block(10, True)])) == 1
    # no quiet block at all: the least contended third (at least one)
    busy = [block(20, False, 0.5), block(14, False, 0.1), block(15, False, 0.2), block(9, False, 0.9),
            block(16, False, 0.3), block(17, False, 0.6)]
    assert sorted(b.times[0] * 1e3 for b in select_blocks(busy)) == [14, 15]
    assert [b.times[0] * 1e3 for b in select_blocks(busy[:2])] == [14]
