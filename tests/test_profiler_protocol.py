"""The served-shape protocol (profiler/shape_protocol.py): a shape's calls move its cached contexts
by a few tokens, symmetric around the shape, and its slab rows, within the model's positions and the slab; the
profile keeps the nominal shape's features; `fixed` repeats the shape exactly."""

from __future__ import annotations

import io

import pandas as pd
import pytest

from simctl.common.errors import InputError
from simctl.profiler.shape_protocol import ShapeProtocol
from simctl.profiler.shapes import (
    FEATURES,
    binpacked_prompts,
    decode,
    decode_mixed,
    hybrid,
    packed_prompts,
    padded_decode,
    padded_insertion,
    prefill,
)
from simctl.profiler.workloads import Grid, build_grid

pytestmark = pytest.mark.torch

SERVED, FIXED = ShapeProtocol("served"), ShapeProtocol("fixed")
NUMERIC = [f for f in FEATURES if f not in ("kind", "q", "c")]


def contexts(shape) -> list[int]:
    return [s.c for s in shape.segs]


def test_calls_vary_contexts_symmetrically_within_bounds():
    """Over every shape of the full and quick grids: each call's contexts are the shape's moved by one offset
    in [-radius, radius] (fresh prompts untouched), no KV length repeats within a cycle, every odd-length
    run of calls from the start is centred on the shape, and every call fits the model's positions and the
    slab (rows packed from a rotating first row)."""
    for name, max_position in (("full", 2048), ("quick", 1100)):
        grid = build_grid(name, max_position, max_kv_tokens=2 ** 17)
        for r in grid.repetitions():
            shape, cycle = r.shape, 2 * r.radius + 1
            slots, max_len = r.slab
            assert max_len <= max_position and r.kv_tokens <= 2 ** 17, shape.label()
            offsets = [r.offset(j) for j in range(3 * cycle)]
            assert sorted(offsets[:cycle]) == list(range(-r.radius, r.radius + 1))
            assert offsets[cycle:] == offsets[:cycle] * 2
            assert all(sum(offsets[:k]) == 0 for k in range(1, cycle + 1, 2))
            bases = set()
            for j in range(cycle + 4):
                moved, base = r.call(j)
                d = r.offset(j)
                assert contexts(moved) == [c + d if c else 0 for c in contexts(shape)]
                assert all(c > 0 for c, c0 in zip(contexts(moved), contexts(shape)) if c0)
                assert moved.max_len <= max_len and base + shape.slots <= slots
                assert moved.kv_len == (shape.kv_len + d if shape.kv_len else shape.kv_len)
                bases.add(base)
            assert bases == set(range(r.spare_slots + 1))


def test_decode_contexts_move_by_a_few_tokens():
    r = SERVED.repetitions(decode(32, 1024), 2048)
    assert (r.radius, r.spare_slots, r.slab) == (64, 3, (35, 1025 + 64))
    assert [contexts(r.call(j)[0])[0] for j in range(5)] == [1024, 1025, 1023, 1026, 1022]
    assert SERVED.repetitions(decode(4, 40), 2048).radius == 5  # an eighth of the context at most
    assert SERVED.repetitions(decode(4, 2047), 2048).radius == 0  # at the model's last position
    assert SERVED.repetitions(prefill(512), 2048).radius == 0  # nothing cached: only the rows move
    hyb = SERVED.repetitions(hybrid(8, 512, 128, 0), 2048)  # the decodes move, the fresh chunk does not
    assert hyb.radius == 64 and contexts(hyb.call(1)[0]) == [513] * 8 + [0]


def test_slab_budget_shrinks_the_variation_not_the_grid():
    """A shape whose nominal slab fills the budget is still timed: first its spare rows, then its radius give
    way; the grid's shapes do not depend on the protocol."""
    shape = decode(64, 1023)  # a slab of 64 x 1024 tokens
    assert SERVED.repetitions(shape, 2048, 64 * 1024).slab == (64, 1024)
    r = SERVED.repetitions(shape, 2048, 64 * 1040)
    assert (r.radius, r.spare_slots) == (16, 0)
    r = SERVED.repetitions(shape, 2048, 66 * 1088)
    assert (r.radius, r.spare_slots, r.slab) == (64, 2, (66, 1088))
    labels = [[s.label() for s in build_grid("full", 2048, 2 ** 17, protocol=p).shapes]
              for p in (SERVED, FIXED)]
    assert labels[0] == labels[1]


@pytest.mark.parametrize("shape", [
    decode(8, 512), decode_mixed([100, 300, 511]), hybrid(4, 256, 64, 1024), prefill(128, 512),
    padded_decode([64, 200, 255], 256), padded_insertion([120, 250], 64, 256), packed_prompts([30, 50]),
    binpacked_prompts([40, 30, 10]),
], ids=lambda s: s.label())
def test_recorded_features_are_the_calls_mean(shape):
    """The profile records the nominal shape's features (`Shape.features`, from its plan through
    `plan_features`): the mean over a cycle of the features of the calls actually run, and the shape-only
    features (tokens, rows, segments, padding to the longest row) of every call."""
    r = SERVED.repetitions(shape, 2048)
    calls = [r.call(j)[0].features() for j in range(2 * r.radius + 1)]
    nominal = shape.features()
    for f in NUMERIC:
        assert sum(c[f] for c in calls) / len(calls) == pytest.approx(nominal[f]), f
    for f in ("kind", "batch_size", "linear_tokens", "sampled_tokens", "num_segments", "decode_rows",
              "decode_pad_kv", "q"):
        assert {c[f] for c in calls} == {nominal[f]}, f
    if any(s.c for s in shape.segs):
        assert r.radius > 0 and len({c["decode_kv"] + c["attn_kv_tokens"] for c in calls}) == len(calls)


def test_fixed_protocol_repeats_the_shape():
    shape = hybrid(4, 256, 64, 1024)
    r = FIXED.repetitions(shape, 2048)
    assert r.slab == (shape.slots, shape.max_len) and {r.call(j) for j in range(5)} == {(shape, 0)}
    assert FIXED.meta()["name"] == "fixed" and SERVED.meta()["max_offset"] == 64
    with pytest.raises(ValueError, match="unknown shape protocol"):
        ShapeProtocol("served-ish")


# ---- the worker runs each call on the slab as the protocol says --------------------------------------------


def record_calls(protocol: ShapeProtocol, shapes: list) -> list[list[tuple]]:
    """Run the worker's repetition loop over `shapes` (6 calls each) with an executor that records, per call,
    the (slot, cached, q) of every segment and the KV width; returns them per shape, with each executor's
    slab."""
    pytest.importorskip("torch")
    from simctl.executor.ragged import RaggedExecutor
    from simctl.profiler.timing import CpuMonitor
    from simctl.profiler.worker import Worker

    made: list[tuple[tuple[int, int], list]] = []

    class Recording(RaggedExecutor):
        def __init__(self, model, slots: int, max_len: int) -> None:
            super().__init__(model, slots, max_len)
            self.calls: list = []
            made.append(((slots, max_len), self.calls))

        def _note(self, segs, kv_len=None) -> None:
            self.calls.append((tuple((s.slot, s.cached, s.q) for s in segs), kv_len))

        def run(self, segments):
            self._note(segments)
            return super().run(segments)

        def run_padded(self, segments, length=None, kv_len=None, dense=False):
            self._note(segments, kv_len)
            return super().run_padded(segments, length, kv_len, dense)

        def run_binpacked(self, rows, length, dense=True):
            self._note([s for row in rows for s in row])
            return super().run_binpacked(rows, length, dense)

    worker = Worker("tiny-2l", "cpu", "float32", 1, "test", 0, io.StringIO(), protocol.name)
    from simctl.executor.model import build_model

    model = build_model(worker.spec, "cpu", "float32", seed=0)
    grid = Grid("t", shapes, warmup=1, min_reps=5, max_reps=5, budget_s=0.0, protocol=protocol,
                max_position=worker.spec.max_position)
    blocks = worker.measure(grid, model, Recording, CpuMonitor(), float("inf"), 4 * 2 * 2 * 2 * 64)
    assert [sum(len(b.times) for b in bs) for bs in blocks] == [5] * len(shapes)
    assert len(made) == len(shapes)  # one executor per shape, made in shape order in the first sweep
    return made


SHAPES = [decode(3, 40), hybrid(2, 24, 6, 16), padded_decode([20, 39], 40), prefill(8, 32),
          packed_prompts([5, 7]), binpacked_prompts([6, 3, 2]), padded_insertion([20, 30], 8, 32)]


def test_worker_calls_move_contexts_and_rows_as_served():
    made = record_calls(SERVED, SHAPES)
    for shape, ((slots, max_len), calls) in zip(SHAPES, made):
        r = SERVED.repetitions(shape, 2048)
        assert (slots, max_len) == r.slab and len(calls) == 6, shape.label()  # the timed warm-up + 5
        for j, (segs, kv_len) in enumerate(calls):
            moved, base = r.call(j)
            assert [s[0] for s in segs] == list(range(base, base + shape.slots))  # packed rows from `base`
            assert sorted((c, q) for _, c, q in segs) == sorted((s.c, s.q) for s in moved.segs)
            assert kv_len == (moved.kv_len if shape.padded else None)
        assert len({segs[0][0] for segs, _ in calls}) == 4  # the first row moves over the spare rows
        if any(s.c for s in shape.segs):  # contexts move by a different offset every call
            assert r.radius >= 2 and len({segs for segs, _ in calls}) == 6, shape.label()
            shifts = [segs[0][1] - shape.segs[0].c for segs, _ in calls]
            assert shifts[:5] == [0, 1, -1, 2, -2]


def test_worker_fixed_protocol_repeats_every_call():
    made = record_calls(FIXED, SHAPES[:3])
    for shape, ((slots, max_len), calls) in zip(SHAPES, made):
        assert (slots, max_len) == (shape.slots, shape.max_len)
        assert len(set(calls)) == 1 and [s[0] for s in calls[0][0]] == list(range(shape.slots))


def test_profile_records_the_protocol_and_nominal_features(tiny_profile, tmp_path):
    from simctl.profiler.profile import profile

    out = tiny_profile
    frame = pd.read_csv(out / "profile.csv")
    nominal = pd.DataFrame([s.features() for s in build_grid("test", 2048).shapes])
    pd.testing.assert_frame_equal(frame[list(FEATURES)], nominal[list(FEATURES)], check_dtype=False)
    meta = pd.read_json(out / "meta.json", typ="series")
    assert meta["shape_protocol"]["name"] == "served" and meta["shape_protocol"]["spare_slots"] == 3
    with pytest.raises(InputError, match="shape protocol"):
        profile("tiny-2l", "cpu", "float32", 1, True, tmp_path / "q", progress=False, grid="test",
                protocol="x")


def test_profile_command_takes_the_protocol():
    from typer.testing import CliRunner

    from simctl.cli import app

    res = CliRunner().invoke(app, ["profile", "--help"])
    assert res.exit_code == 0 and "--protocol" in res.output and "served" in res.output
