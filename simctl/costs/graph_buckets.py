"""CUDA-graph decode steps as the executor runs them (`executor/cuda_graphs.py`) and a fitted cost model
prices them (`costs/fitted.py`): the shapes graphs are captured at, and a decode plan padded to them.

A CUDA graph replays fixed shapes, so a decode step of n rows runs as the graph of the smallest captured
batch size B >= n (vLLM's default capture sizes: 1, 2, 4, then every multiple of 8 up to 512, its
`cudagraph_capture_sizes`), the B - n padding rows computed and discarded. vLLM's paged-attention kernels
take each row's length as data; PyTorch's SDPA kernels take a KV length as a shape, so simctl's graphs are
also keyed on the KV columns every row reads, the longest row's context + 1 rounded up to a multiple of
`kv_block` (masked beyond each row's own). Both paddings are real work: the linear layers and the LM head
run B rows and attention reads B x K columns, which is what `GraphShapes.executed` turns a plan into (a
padded decode step, `policies.plan.padded_decode`), so a profile records and a fit prices the step as run.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from simctl.policies.plan import BatchPlan, Layout, padded_decode

MAX_CAPTURE_ROWS = 512
CAPTURE_SIZES: tuple[int, ...] = (1, 2, 4, *range(8, MAX_CAPTURE_ROWS + 1, 8))
KV_BLOCK = 256


@dataclass(frozen=True, slots=True)
class GraphShapes:
    """The graphs an executor captures: batch sizes up to `max_rows` (its KV slots; the largest bucket is
    `max_rows` itself when it is not a capture size) and KV lengths in multiples of `kv_block`."""

    max_rows: int = MAX_CAPTURE_ROWS
    kv_block: int = KV_BLOCK

    def __post_init__(self) -> None:
        if self.max_rows < 1 or self.kv_block < 1:
            raise ValueError(f"graph shapes need max_rows and kv_block >= 1, got {self.max_rows}, "
                             f"{self.kv_block}")

    def rows(self, n: int) -> int | None:
        """The graph batch size of a decode step of `n` rows (or spanning n KV slots); None beyond
        `max_rows` (the step runs eager)."""
        if n > self.max_rows:
            return None
        i = bisect.bisect_left(CAPTURE_SIZES, n)
        return min(CAPTURE_SIZES[i], self.max_rows) if i < len(CAPTURE_SIZES) else self.max_rows

    def kv(self, longest: int) -> int:
        """KV columns a graph reads for a step whose longest row reads `longest` (its context + 1); an array
        of them for an array (a decode stretch)."""
        return -(-longest // self.kv_block) * self.kv_block

    def executed(self, plan: BatchPlan) -> BatchPlan:
        """`plan` as the graphed executor runs it: a ragged step in which each of its n sequences brings one
        token onto a cached context (decodes; a prompt's last 1-token chunk computes the same) becomes a
        padded decode of B rows x K KV columns (B - n idle rows); any other plan, one beyond the largest
        graph, or a 1-token prompt (nothing cached: a prefill kernel runs it), as it is (it runs eager)."""
        seqs = plan.seqs
        if (plan.layout is not Layout.PACKED or not seqs or any(q != 1 for q in plan.num_new)
                or any(s.computed < 1 for s in seqs)):
            return plan
        rows = self.rows(len(seqs))
        if rows is None:
            return plan
        return padded_decode(seqs, rows, self.kv(max(s.computed for s in seqs) + 1))

    def to_json(self) -> dict[str, int]:
        return {"max_rows": self.max_rows, "kv_block": self.kv_block}
