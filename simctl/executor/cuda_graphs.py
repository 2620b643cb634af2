"""CUDA-graph decode steps of a `RaggedExecutor` (`ExecutorConfig.eager = False`): a decode-only iteration is
replayed from a graph captured once per (batch size, KV length) bucket (`costs.graph_buckets.GraphShapes`),
so the GPU runs the step's few hundred kernels without Python launching each (eager mode is host-bound: ~22
ms a step for a 7B model on an H100, simctl issue 22; on an H200 graphs took a 32-row step at 2k context from
20.2 to 11.9 ms, `bench/results/gpu_h200.md`).

A graph of B rows and K KV columns runs the slab's slots 0..B-1 as one decode batch: the engine keeps its
running requests packed in the lowest slots (`executor.plans.SlotPool`), so a step of n decode rows spans
n slots and B is n's bucket. Its inputs are static tensors, written before each replay with one copy: row r
gets slot r's token and position, writes its K/V into slot r and reads its own context + 1 columns (an
additive mask built inside the graph from the row lengths); a row whose slot does not decode this step
(padding) reads column 0, writes into a scratch slot past the executor's slots and its logits are dropped.
Graphs share one memory pool (one runs at a time) and one logits buffer of the largest batch (each graph
writes its rows' logits there, read out right after its replay: a buffer per graph held B x vocab each, GBs
over hundreds of graphs), and are captured at first use, after a warm-up forward on
a side stream, as torch requires: a profile's warm-up repetition pays for that, and the real engine captures
every graph its slab can use before serving (`capture_all`, as vLLM does at start).
Mixtures of experts are refused: transformers' expert routing reads which experts were hit on the host, which
a graph cannot capture.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from simctl.common.errors import InputError
from simctl.costs.graph_buckets import CAPTURE_SIZES, GraphShapes
from simctl.executor.ragged_attention import BATCH_KWARG, Batch, DecodeRows


@dataclass(slots=True)
class _Graph:
    inputs: torch.Tensor  # [4, B] int64: token id, position, slab row written, KV length read
    forward: Callable[[], torch.Tensor]  # the step on `inputs`: its logits [B, vocab]
    graph: torch.cuda.CUDAGraph | None = None  # the step captured (None: `forward` runs, off CUDA)
    logits: torch.Tensor | None = None  # the captured step's output: rows of the shared logits buffer

    def replay(self) -> torch.Tensor:
        if self.graph is None:
            return self.forward()
        self.graph.replay()
        return self.logits


class DecodeGraphs:
    """The CUDA graphs of one executor's decode steps (see the module docstring). `scratch`: the slab row
    padding rows write into (the executor allocates one beyond its slots). Off CUDA nothing is captured and
    each step runs the graph's padded computation directly: tests check it against eager steps on a CPU."""

    # executor: the `executor.ragged.RaggedExecutor` it belongs to, segments its `Segment`s (not imported:
    # that module builds this one)
    def __init__(self, executor: Any, shapes: GraphShapes, scratch: int) -> None:
        if getattr(executor.model.config, "num_local_experts", None):
            raise InputError("CUDA-graph decode of a mixture of experts is not built (transformers routes "
                             "tokens to experts through host-side reads); profile and run it with --eager")
        # weak: the executor holds this object, and a cycle would keep its KV slab (GBs) alive until the
        # collector ran; a profile builds an executor per shape and ran an H100 out of memory so (issue 41)
        self.ex = weakref.proxy(executor)
        self.shapes = shapes
        self.scratch = scratch
        self.capture = executor.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if self.capture else None
        head = executor.model.lm_head
        self.logits = torch.empty(shapes.max_rows, head.out_features, dtype=executor.dtype,
                                  device=executor.device)
        self.graphs: dict[tuple[int, int], _Graph] = {}

    def bucket(self, segments: Sequence[Any]) -> tuple[int, int] | None:
        """(B, K) of a step of one token per segment on cached context, or None where it runs eager (a
        prefill, a 1-token prompt, or beyond the graphs): as `GraphShapes.executed` prices it."""
        if any(s.q != 1 or s.cached < 1 for s in segments):
            return None
        rows = self.shapes.rows(max(s.slot for s in segments) + 1)
        if rows is None:
            return None
        return rows, self.shapes.kv(max(s.cached for s in segments) + 1)

    def run(self, segments: Sequence[Any], key: tuple[int, int]) -> torch.Tensor:
        """Replay the graph `key` (`bucket(segments)`) for `segments`: the logits of the sampled ones, in
        segment order."""
        graph = self.graphs.get(key) or self._capture(*key)
        rows = key[0]
        ids, pos, slot, lens = [0] * rows, [0] * rows, [self.scratch] * rows, [1] * rows
        for s in segments:
            r = s.slot
            ids[r], pos[r], slot[r], lens[r] = int(s.tokens[0]), s.cached, r, s.cached + 1
        host = torch.tensor([ids, pos, slot, lens], dtype=torch.long)
        # a fresh pinned buffer each step: the caching host allocator keeps it until its copy has run
        with torch.inference_mode():
            graph.inputs.copy_(host.pin_memory() if self.capture else host, non_blocking=True)
            logits = graph.replay()
        return logits[[s.slot for s in segments if s.sample]]

    def capture_all(self) -> None:
        """Capture every graph the executor's slab can use (largest first, as they share one pool)."""
        sizes = [b for b in CAPTURE_SIZES if b < self.shapes.max_rows] + [self.shapes.max_rows]
        lengths = range(self.shapes.kv_block, self.shapes.kv(self.ex.max_len) + 1, self.shapes.kv_block)
        for rows in reversed(sizes):
            for kv in reversed(lengths):
                if (rows, kv) not in self.graphs:
                    self._capture(rows, kv)

    def _capture(self, rows: int, kv: int) -> _Graph:
        ex = self.ex
        inputs = torch.zeros(4, rows, dtype=torch.long, device=ex.device)
        inputs[2].fill_(self.scratch)
        inputs[3].fill_(1)
        columns = torch.arange(kv, device=ex.device)

        def forward() -> torch.Tensor:
            ids, pos, slot, lens = inputs
            blocked = columns[None, :] >= lens[:, None]
            mask = torch.zeros(rows, 1, 1, kv, dtype=ex.dtype, device=ex.device).masked_fill_(
                blocked[:, None, None, :], float("-inf"))
            batch = Batch(ex.kv, ex.attn, False, slot, pos,
                          decodes=DecodeRows(slice(0, rows), slice(0, rows), None, kv, mask))
            kwargs = {"input_ids": ids[None], "position_ids": pos[None], BATCH_KWARG: batch}
            hidden, head, out = ex.forward_hidden(kwargs)[0], ex.model.lm_head, self.logits[:rows]
            if head.bias is None:
                return torch.mm(hidden, head.weight.t(), out=out)
            return torch.addmm(head.bias, hidden, head.weight.t(), out=out)

        step = self.graphs[rows, kv] = _Graph(inputs, forward)
        if self.capture:
            with torch.inference_mode():
                side = torch.cuda.Stream(ex.device)
                side.wait_stream(torch.cuda.current_stream(ex.device))
                with torch.cuda.stream(side):
                    forward()  # kernels chosen and workspaces allocated before capture
                torch.cuda.current_stream(ex.device).wait_stream(side)
                step.graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(step.graph, pool=self.pool):
                    step.logits = forward()
        return step
