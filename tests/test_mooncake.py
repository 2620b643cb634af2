"""Mooncake's trace files (simctl.traces.mooncake): rows read and validated, the hash block at a scale, prefix
identities handed to the requests; the published conversation trace where ../shared/reference has it."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from simctl.common.errors import InputError
from simctl.traces.build import build_trace
from simctl.traces.loaders import load_trace_file
from simctl.traces.mooncake import infinite_cache_hit_rate
from simctl.traces.workload import Workload

MOONCAKE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "mooncake"
ROWS = ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}\n'
        '{"timestamp": 250, "input_length": 1000, "output_length": 2, "hash_ids": [0, 1]}\n'
        '\n'
        '{"timestamp": 1500, "input_length": 513, "output_length": 1, "hash_ids": [0, 2]}\n')


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "trace.jsonl"
    path.write_text(text)
    return str(path)


def test_rows_become_requests_with_their_block_ids(tmp_path: Path) -> None:
    reqs = build_trace(write(tmp_path, ROWS), None, None, 0)
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens) for r in reqs] == [
        (0.0, 600, 5), (0.25, 1000, 2), (1.5, 513, 1)]  # milliseconds to seconds
    assert [(r.hash_ids, r.hash_block) for r in reqs] == [((0, 1), 512), ((0, 1), 512), ((0, 2), 512)]


def test_scaled_blocks_keep_each_prompt_s_id_count(tmp_path: Path) -> None:
    reqs = build_trace(write(tmp_path, ROWS), None, None, 0, scale=0.1)
    # the block: round(51.2) = 51 tokens; prompts round(60) = 60, round(100) = 100 and round(51.3) = 51, the
    # last moved up to 52, the fewest tokens 2 ids of 51 cover
    assert [(r.prompt_tokens, r.hash_block) for r in reqs] == [(60, 51), (100, 51), (52, 51)]
    assert all(math.ceil(r.prompt_tokens / r.hash_block) == len(r.hash_ids) for r in reqs)


@pytest.mark.parametrize(("row", "message"), [
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0, "a"]}',
     "line 1: hash_ids holds 'a', expected integer ids >= 0"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": []}',
     "line 1: hash_ids is [], expected a non-empty list"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 5, "hash_ids": [0]}',
     "line 1: input_length is 0, expected an integer >= 1"),
    ('{"timestamp": -1, "input_length": 600, "output_length": 5, "hash_ids": [0, 1]}',
     "line 1: timestamp is -1, expected a time >= 0 in milliseconds"),
    ('{"timestamp": 0, "input_length": 600, "hash_ids": [0, 1]}', "line 1: output_length is None"),
    ('{"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [0]}',
     "request 1: 1 hash_ids for 600 prompt tokens, but blocks of 512 tokens (--hash-block-size) make 2"),
])
def test_bad_rows_are_one_line(tmp_path: Path, row: str, message: str) -> None:
    with pytest.raises(InputError, match=re.escape(message)):
        build_trace(write(tmp_path, row + "\n"), None, None, 0)


def test_unsorted_rows_and_other_block_sizes(tmp_path: Path) -> None:
    path = write(tmp_path, ROWS.replace('"timestamp": 1500', '"timestamp": 100'))
    with pytest.raises(InputError, match="line 4: timestamp 100 is earlier than the line before's 250"):
        load_trace_file(path)
    one = write(tmp_path, '{"timestamp": 0, "input_length": 33, "output_length": 1, "hash_ids": [4, 5, 6]}\n')
    assert build_trace(one, None, None, 0, hash_block=16)[0].hash_ids == (4, 5, 6)  # vLLM timed_trace's 16
    with pytest.raises(InputError, match="blocks of 512 tokens"):
        build_trace(one, None, None, 0)
    with pytest.raises(InputError, match="--hash-block-size must be an integer from 1"):
        Workload(trace=one, qps=None, num_requests=1, hash_block_size=0).validate()


def test_infinite_cache_hit_rate_by_hand(tmp_path: Path) -> None:
    trace = load_trace_file(write(tmp_path, ROWS))
    assert trace.hash_ids is not None
    # the second prompt hits both ids, but its second block is partial (1000 tokens): 512; the third its first
    rate = infinite_cache_hit_rate(trace.prompt_tokens, trace.hash_ids, 512)
    assert rate == (512 + 512) / (600 + 1000 + 513)


@pytest.mark.skipif(not (MOONCAKE / "conversation_trace.jsonl").exists(), reason="no ../shared/reference")
def test_the_conversation_trace() -> None:
    trace = load_trace_file(MOONCAKE / "conversation_trace.jsonl")
    assert trace.hash_ids is not None and len(trace) == 12031
    # the README's figure for this trace: 37.3% of its prompt tokens hit a cache that never evicts
    rate = infinite_cache_hit_rate(trace.prompt_tokens, trace.hash_ids, 512)
    assert rate == pytest.approx(0.373, abs=5e-4)  # 0.37338
    reqs = build_trace(str(MOONCAKE / "conversation_trace.jsonl"), 2000, None, 0)
    assert all(math.ceil(r.prompt_tokens / 512) == len(r.hash_ids) for r in reqs)
