"""Mooncake's trace format (kvcache-ai/Mooncake, FAST'25 traces), which is also what `vllm bench serve
--dataset-name timed_trace` replays with its default labels (vllm/benchmarks/datasets/datasets.py:
TimedTrace).

JSONL, one request a line: ``timestamp`` (arrival, milliseconds from the start), ``input_length`` and
``output_length`` (tokens) and ``hash_ids``: the identities of the prompt's blocks of a fixed number of tokens
(512 in Mooncake's traces; `Workload.hash_block_size`), in order, the last one covering a partial block. The
ids are chained (an id names its block's content and everything before it), so two prompts with the same first
k ids share their first k blocks' tokens. A file whose first record has ``hash_ids`` is read here
(`simctl.traces.loaders.load_trace_file`).

vLLM's timed_trace takes the timestamp's unit as an option (``--timed-trace-sec-multiplier``, 1 by default):
its files in seconds must be rewritten in milliseconds to be read here. That the ids' count matches the prompt
at the block size is checked where the block size is known (`check_hash_counts`); vLLM's reader instead makes
the prompt as long as its ids cover.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simctl.common.errors import InputError
from simctl.traces.row_checks import fail, short

HASH_IDS = "hash_ids"
TIMESTAMP, INPUT, OUTPUT = "timestamp", "input_length", "output_length"
MAX_ID = 2**63 - 1


@dataclass(frozen=True, slots=True)
class MooncakeRows:
    prompt_tokens: np.ndarray  # int64, >= 1
    output_tokens: np.ndarray  # int64, >= 1
    arrival_s: np.ndarray  # float64, seconds
    hash_ids: tuple[tuple[int, ...], ...]


def is_mooncake_file(path: Path) -> bool:
    """Whether a JSONL trace's first record is Mooncake's (it names its prompt's block ids); a file that
    cannot be read or parsed is not (the JSONL reader then says why)."""
    try:
        with path.open(encoding="utf-8-sig") as f:
            first = next((line for line in f if line.strip()), "")
        record = json.loads(first)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(record, dict) and HASH_IDS in record


def _fail(path: Path, line: int, msg: str) -> InputError:
    return fail(path, line, f"{msg} (a Mooncake record: {TIMESTAMP} in ms, {INPUT}, {OUTPUT}, {HASH_IDS})")


def _integer(path: Path, line: int, obj: dict, key: str, minimum: int) -> int:
    value = obj.get(key)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _fail(path, line, f"{key} is {short(value)}, expected an integer >= {minimum}")
    return value


def _ids(path: Path, line: int, obj: dict) -> tuple[int, ...]:
    ids = obj.get(HASH_IDS)
    if not isinstance(ids, list) or not ids:
        raise _fail(path, line, f"{HASH_IDS} is {short(ids)}, expected a non-empty list of integer ids")
    for v in ids:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_ID:
            raise _fail(path, line, f"{HASH_IDS} holds {short(v)}, expected integer ids >= 0")
    return tuple(ids)


def read_mooncake(path: Path) -> MooncakeRows:
    """Every record of the file, validated; InputError naming the first bad line."""
    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"trace file {path}: cannot read ({e})") from None
    prompts, outputs, stamps, ids = [], [], [], []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError as e:
            raise _fail(path, lineno, f"invalid JSON ({e.msg})") from None
        if not isinstance(obj, dict):
            raise _fail(path, lineno, f"expected a JSON object, got {type(obj).__name__}")
        stamp = obj.get(TIMESTAMP)
        if isinstance(stamp, bool) or not isinstance(stamp, (int, float)) or not math.isfinite(stamp) \
                or stamp < 0:
            raise _fail(path, lineno, f"{TIMESTAMP} is {short(stamp)}, expected a time >= 0 in milliseconds")
        if stamps and stamp < stamps[-1]:
            raise _fail(path, lineno, f"{TIMESTAMP} {stamp} is earlier than the line before's {stamps[-1]}; "
                                      "arrivals must be sorted")
        stamps.append(stamp)
        prompts.append(_integer(path, lineno, obj, INPUT, 1))
        outputs.append(_integer(path, lineno, obj, OUTPUT, 1))
        ids.append(_ids(path, lineno, obj))
    if not ids:
        raise InputError(f"trace file {path}: empty file (expected one JSON object per line)")
    return MooncakeRows(np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64),
                        np.asarray(stamps, dtype=np.float64) / 1000.0, tuple(ids))


def check_hash_counts(path: Path, prompts: np.ndarray, hash_ids: tuple[tuple[int, ...], ...],
                      block: int) -> None:
    """InputError unless every prompt has ceil(prompt / block) ids (the first bad request named)."""
    counts = np.fromiter(map(len, hash_ids), dtype=np.int64, count=len(hash_ids))
    bad = counts != -(-prompts[:len(counts)] // block)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"trace file {path}, request {i + 1}: {counts[i]} {HASH_IDS} for {prompts[i]} "
                         f"prompt tokens, but blocks of {block} tokens (--hash-block-size) make "
                         f"{-(-int(prompts[i]) // block)}")


def scaled_block(block: int, scale: float) -> int:
    """The hash block of lengths scaled by `scale`: round(block x scale), at least 1 token."""
    return max(1, math.floor(block * scale + 0.5))


def keep_id_counts(prompts: np.ndarray, hash_ids: tuple[tuple[int, ...], ...], block: int) -> np.ndarray:
    """Scaled prompts moved into the range their id count covers at the scaled `block` (k ids: from
    (k - 1) x block + 1 to k x block tokens), so each keeps ceil(prompt / block) = k ids."""
    counts = np.fromiter(map(len, hash_ids), dtype=np.int64, count=len(hash_ids))
    return np.clip(prompts, (counts - 1) * block + 1, counts * block)


def infinite_cache_hit_rate(prompts: np.ndarray, hash_ids: tuple[tuple[int, ...], ...], block: int) -> float:
    """The token hit rate of a cache that never evicts, served one request at a time in order, at the ids'
    granularity: a prompt's run of first ids seen before hits, its full blocks among them (a partial last
    block is never a hit, as in a KV cache of full blocks). 37.3% on Mooncake's conversation trace, as its
    README says (counting a hit partial block too: 37.4%)."""
    seen: set[int] = set()
    hits = 0
    for prompt, ids in zip(prompts.tolist(), hash_ids):
        k = 0
        while k < len(ids) and ids[k] in seen:
            k += 1
        hits += min(k, prompt // block) * block
        seen.update(ids)
    return hits / int(prompts.sum())
