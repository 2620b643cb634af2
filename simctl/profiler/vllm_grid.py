"""The vLLM steps a vLLM profile times (`profiler/vllm_worker.py` drives them): decode batches, prefill chunks
on cached context, and mixed steps (decodes + a chunk), each made by what is submitted to an idle engine.

A `StepProbe` names the step it times; the worker makes it as serving does:

- decode (B, C): B requests whose prompts are prefilled first (untimed), then `timed` decode steps of the B
  at contexts growing by one a step, centred on C (contexts grow in serving: no per-shape cache stays warm);
  with a spread S, the B contexts spread evenly over C - S .. C + S, as a served batch's are (requests of
  unequal lengths: the fit's padding term, what a step pays beyond its mean context);
- prefill (q, c): a request of c + q prompt tokens (more if the chunk stops mid-prompt: `sample` False),
  its first c computed by an untimed step, then the timed step computes q tokens on the c cached;
- hybrid (B, C, q, c): a decode batch as above with, each repetition, a new request whose chunk q at c runs
  in the same step as the B decodes (the untimed step before computes its first c tokens alongside them).

Chunk sizes are set per step by the scheduler's token budget (see the worker); every timed step's shape is
the one the scheduler actually scheduled, and the profile row's features are that shape's
(`policies.plan.packed` + `costs.features.plan_features`, as the simulator's). A grid's `served` batch
sizes are then served as closed batches (`profiler/vllm_served.py`: what serving adds per step). `VLLM_GRIDS`:
`full` (a few minutes for `tiny` on a 2-core CPU, engine starts included), `quick` (about two minutes) and
`test` (no served stage).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from simctl.catalogue.moe import MoE
from simctl.profiler.workloads import expert_union_tokens

ProbeKind = Literal["decode", "prefill", "hybrid"]


@dataclass(frozen=True, slots=True)
class StepProbe:
    kind: ProbeKind
    decodes: int = 0  # B: decode requests in the step
    context: int = 0  # C: their context at the middle timed step
    chunk: int = 0  # q: the prefill chunk's new tokens (0: none)
    cached: int = 0  # c: the chunk's cached context
    sample: bool = True  # the chunk reaches its prompt's end (samples a token)
    spread: int = 0  # S: the decodes' contexts spread evenly over C - S .. C + S (0: all at C)

    def label(self) -> str:
        parts = []
        if self.decodes:
            parts.append(f"{self.decodes} decodes at {self.context}"
                         + (f" +- {self.spread}" if self.spread else ""))
        if self.chunk:
            parts.append(f"chunk {self.chunk} on {self.cached}" + ("" if self.sample else " (mid-prompt)"))
        return f"{self.kind} " + " + ".join(parts)


@dataclass(frozen=True, slots=True)
class VLLMGrid:
    name: str
    probes: tuple[StepProbe, ...]
    blocks: int  # visits of each probe, in a fresh seeded order each sweep
    timed: int  # timed steps per visit (decode steps, or repetitions of a chunk)
    # the served-mode calibration (`profiler/vllm_served.py`): closed decode batches served, and how often
    served: tuple[int, ...] = ()
    served_repeats: int = 0
    stream: bool = False  # the served stage also serves request streams (`profiler/vllm_stream.py`)

    @property
    def shapes(self) -> tuple[StepProbe, ...]:  # as `simctl.profiler.sweeps.summarise_blocks` reads a grid
        return self.probes

    @property
    def quiet_blocks(self) -> int:
        return self.blocks


def _decodes(batches: tuple[int, ...], contexts: tuple[int, ...]) -> list[StepProbe]:
    return [StepProbe("decode", b, c) for b in batches for c in contexts]


def _prefills(chunks: tuple[int, ...]) -> list[StepProbe]:
    return [StepProbe("prefill", chunk=q) for q in chunks]


def _full() -> VLLMGrid:
    probes = [
        # decodes: the per-row attention curve over contexts, the batch's linear/LM-head cost over B (B x C
        # kept below ~64K prompt tokens: each visit prefills them)
        *_decodes((1, 4, 16), (32, 256, 1024, 1900)), *_decodes((32, 64), (32, 256, 1024)),
        *_decodes((128, 256), (32, 200)),
        # decodes at unequal contexts, as served batches hold them: a batch of 32 at contexts 32-940, over a
        # fit without these, served 18% dearer relative to its price than one at a single context; over a fit
        # with them, 3% (research/vllm_decode_mix.py). Their padding term fits to 0 (paged attention pays
        # none): what they correct is the per-row curve over mean contexts
        *(StepProbe("decode", b, c, spread=s) for b, c, s in ((16, 1000, 900), (32, 512, 480), (64, 512, 480),
                                                              (128, 256, 220))),
        # whole prompts at powers of two and between (the linear curve's knots; decode batch sizes included)
        *_prefills((1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 129, 192, 256, 384, 512, 768, 1024, 1536, 2000)),
        # chunks on cached context, half mid-prompt (sampling nothing: the LM head told from the overhead)
        *(StepProbe("prefill", chunk=q, cached=c, sample=s)
          for q in (64, 256, 1024) for c in (256, 896) for s in (True, False)),
        # mixed steps: decodes + a chunk, as vLLM runs a prompt arriving into a running batch; one decode
        # fewer than a decode probe's batch, so that with the chunk's token they sample a count the decode
        # rows measure: alone at 5, 33 and 65, their LM-head knots took the chunk's cost (0.3 ms from 4 to
        # 5 sampled rows) and priced decode batches of 5-16 0.3-0.5 ms above served vLLM's
        *(StepProbe("hybrid", b, ctx, q, c) for b, ctx in ((3, 512), (31, 256), (63, 1024))
          for q, c in ((16, 0), (256, 0), (512, 512))),
    ]
    return VLLMGrid("full", tuple(probes), blocks=5, timed=8, served=(1, 4, 16, 64, 128), served_repeats=3,
                    stream=True)


def _quick() -> VLLMGrid:
    probes = [*_decodes((1, 16), (64, 1024)), StepProbe("decode", 64, 200),
              *_prefills((1, 16, 128, 512, 1536)),
              StepProbe("prefill", chunk=256, cached=512),
              StepProbe("prefill", chunk=256, cached=512, sample=False), StepProbe("hybrid", 15, 256, 128, 0),
              StepProbe("hybrid", 15, 512, 256, 256)]
    return VLLMGrid("quick", tuple(probes), blocks=3, timed=6, served=(1, 16), served_repeats=1)


def _test() -> VLLMGrid:
    probes = [StepProbe("decode", 4, 64), StepProbe("decode", 16, 128), *_prefills((8, 64, 256)),
              StepProbe("prefill", chunk=64, cached=128, sample=False), StepProbe("hybrid", 3, 64, 32, 32)]
    # a served stage as the others have, at two batch sizes: the tests check the whole pipeline on it
    return VLLMGrid("test", tuple(probes), blocks=2, timed=4, served=(1, 4), served_repeats=1)


VLLM_GRIDS = {"full": _full, "quick": _quick, "test": _test}


def vllm_grid(name: str, moe: MoE | None = None) -> VLLMGrid:
    """Grid `name`; a mixture of experts (`moe`) adds, outside the test grid, whole prompts and decode batches
    of every token count over which its union of routed experts grows (as simctl's own grid does)."""
    grid = VLLM_GRIDS[name]()
    if moe is None or name == "test":
        return grid
    union = expert_union_tokens(moe)
    have = set(grid.probes)
    extra = [p for p in (*_prefills(tuple(union)), *_decodes(tuple(union), (256,))) if p not in have]
    return replace(grid, probes=grid.probes + tuple(extra))
