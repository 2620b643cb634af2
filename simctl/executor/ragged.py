"""A ragged executor: runs one serving iteration (any mix of prefills, chunks on cached context and decodes)
as ONE forward pass of a transformers Llama model over a preallocated KV slab.

KV slab: `kv[layer, 0 or 1, slot, kv_head, position, head_dim]` (0 = K, 1 = V; a slot is one request's
row, positions 0..max_len-1). It is allocated once; requests never move.

Ragged mode (`run`): each `Segment(slot, tokens, cached)` brings q new tokens of a request whose first
c = `cached` tokens are already in its slot. All tokens of the iteration are flattened into a single
`[1, T]` forward with position ids c..c+q-1 per segment, so the linear layers see exactly T = sum(q) rows.
The attention function it registers (`simctl.executor.ragged_attention`) then, per layer:

1. writes each segment's new K/V into its slot at positions c..c+q-1 (one index_put for all tokens);
2. decode rows (q = 1) run as ONE batched attention over a view of the slab: the rows lo..hi spanning their
   slots, `[hi - lo + 1, KVH, kmax, D]` with kmax the longest row's KV length, and an additive float mask
   hiding columns beyond each row's own context when contexts differ. A view, not a gather: copying the KV
   of 64 rows x 1,024 tokens cost 7x the attention itself here (tiny, CPU). A slot inside the span that is
   not decoding (a hole) gets a zero query whose output is dropped, so the executor's user should keep the
   running requests in few consecutive slots (the engine compacts its slots for this, `simctl.engine.serve`);
3. each prefill segment (q > 1) attends to keys 0..c+q-1 of its own slot, causal within the new tokens:
   `is_causal` when c = 0, else an additive float mask aligned bottom-right (query i sees keys <= c + i).
   Attention FLOPs are therefore sum q*(c + q/2) (per segment), not (sum q)^2 as a block-diagonal mask over
   the packed row would cost.

No segment ever sees another's tokens, so a packed iteration gives each request exactly the logits it would
get alone (tests/test_profiler.py checks this against transformers' own SDPA model to 1e-5 in fp32).

Padded mode (`run_padded`): the same segments laid out as a real `[B, L]` batch, L = the longest q (or a
given length), pads on the right and computed like real tokens (their K/V are written past the row's
length, where no later iteration looks). Attention runs over `[B, KVH, K, D]` with K = max(c) + L (or a given
`kv_len`, e.g. a FasterTransformer batch keeping finished rows' KV): the padded KV is read too. Real
positions get the same logits as unpadded runs.

Bin-packed mode (`run_binpacked`, Prepacking): whole prompts packed back to back in `[B, L]` rows, positions
restarting at 0 for each prompt, and a block-diagonal causal mask, so a token sees only its own prompt;
attention runs over the row's fresh keys (a dense-masked L x L block; or, varlen, causal over each prompt's
own span) and each prompt's K/V is written to its own slot at positions 0..q-1 (unpacked), pads nowhere.
Each prompt gets the logits it gets alone.

SDPA kernels and grouped-query heads: `simctl.executor.ragged_attention`.

Only the last token of each segment with `sample=True` reaches the LM head: the final hidden states are
gathered at those rows before `lm_head`.

Everything is device-agnostic (index tensors are built on the model's device); CPU fallback is never
silent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.nn.attention import sdpa_kernel

from simctl.common.errors import InputError
from simctl.costs.graph_buckets import MAX_CAPTURE_ROWS, GraphShapes
from simctl.executor.config import DEFAULT_CONFIG, ExecutorConfig
from simctl.executor.cuda_graphs import DecodeGraphs
from simctl.executor.ragged_attention import (
    ATTN_IMPLEMENTATION,
    BATCH_KWARG,
    Batch,
    DecodeRows,
    PrefillSegment,
    attention_layout,
    noting_kernels,
)


@dataclass(frozen=True, slots=True)
class Segment:
    """q new tokens of the request in `slot`, whose first `cached` tokens are already in the slab."""

    slot: int
    tokens: Sequence[int] | torch.Tensor
    cached: int = 0
    sample: bool = True  # the last token's logits are wanted (the end of a prompt, or a decode)

    @property
    def q(self) -> int:
        return len(self.tokens)


def _as_index(values: list[int], device: torch.device) -> slice | torch.Tensor:
    """A slice when `values` are consecutive ascending (indexing then gives a view), else a long tensor."""
    if values and values == list(range(values[0], values[0] + len(values))):
        return slice(values[0], values[0] + len(values))
    return torch.tensor(values, dtype=torch.long, device=device)


def _additive(blocked: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool `blocked` -> additive float mask (0 where attended, -inf where blocked)."""
    return torch.zeros(blocked.shape, dtype=dtype, device=blocked.device).masked_fill_(blocked, float("-inf"))


class RaggedExecutor:
    """Executes iterations of `model` (built by `simctl.executor.model.build_model`) over a KV slab of `slots`
    request rows of `max_len` positions each."""

    def __init__(self, model: torch.nn.Module, slots: int, max_len: int,
                 config: ExecutorConfig = DEFAULT_CONFIG) -> None:
        cfg = model.config
        if cfg._attn_implementation != ATTN_IMPLEMENTATION:
            raise ValueError(f"model must use attn_implementation={ATTN_IMPLEMENTATION!r} (got "
                             f"{cfg._attn_implementation!r}); build it with executor.model.build_model")
        if slots < 1 or max_len < 1:
            raise ValueError(f"slots and max_len must be >= 1, got {slots}, {max_len}")
        self.model = model
        self.device = model.device
        self.dtype = model.dtype
        self.slots = int(slots)
        self.max_len = int(max_len)
        self.config = config
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.attn = attention_layout(config.backends(self.device.type), self.device, self.dtype,
                               cfg.num_attention_heads, cfg.num_key_value_heads, head_dim)
        rows, positions = self.slots, self.max_len
        if not config.eager:  # decode graphs: a scratch row for padding rows, whole KV blocks per row
            shapes = GraphShapes(min(self.slots, MAX_CAPTURE_ROWS))
            rows, positions = rows + 1, shapes.kv(positions)
        with torch.inference_mode():
            self.kv = torch.zeros(cfg.num_hidden_layers, 2, rows, cfg.num_key_value_heads, positions,
                                  head_dim, dtype=self.dtype, device=self.device)
        self.graphs = None if config.eager else DecodeGraphs(self, shapes, scratch=self.slots)

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V one token takes over all layers (measured from the allocated slab)."""
        return self.kv.element_size() * self.kv[:, :, 0, :, 0].numel()

    # ---- input preparation ----------------------------------------------------------------------------
    def _check(self, segments: Sequence[Segment], length: int | None = None) -> None:
        if not segments:
            raise ValueError("an iteration needs at least one segment")
        seen: set[int] = set()
        for s in segments:
            if not 0 <= s.slot < self.slots:
                raise ValueError(f"slot {s.slot} outside 0..{self.slots - 1}")
            if s.slot in seen:
                raise ValueError(f"slot {s.slot} appears twice in one iteration")
            seen.add(s.slot)
            if s.q < 1 or s.cached < 0:
                raise ValueError(
                    f"segment of slot {s.slot}: need q >= 1 and cached >= 0, got {s.q}, {s.cached}")
            end = s.cached + (s.q if length is None else length)
            if end > self.max_len:
                raise ValueError(f"segment of slot {s.slot} reaches position {end} > max_len {self.max_len}")

    def _fold(self, mask: torch.Tensor) -> torch.Tensor:
        """A mask `[B, 1, L, K]` for the folded query axis of `sdpa`: each group's G heads, L rows each (a
        mask with one query row broadcasts as it is). G times the memory: built once per iteration."""
        G = self.attn.groups
        return mask if G == 1 or mask.shape[-2] == 1 else mask.repeat(1, 1, G, 1)

    def _token_tensor(self, segments: Sequence[Segment]) -> torch.Tensor:
        parts = [torch.as_tensor(s.tokens, dtype=torch.long).reshape(-1) for s in segments]
        return torch.cat(parts).to(self.device, non_blocking=True)

    def prepare(self, segments: Sequence[Segment]) -> tuple[dict[str, Any], torch.Tensor]:
        """Model-forward kwargs for a ragged iteration, and the flattened rows whose logits are sampled."""
        self._check(segments)
        dev = self.device
        starts, positions, write_slot, sampled = [], [], [], []
        t = 0
        for s in segments:
            starts.append(t)
            positions.extend(range(s.cached, s.cached + s.q))
            write_slot.extend([s.slot] * s.q)
            t += s.q
            if s.sample:
                sampled.append(t - 1)
        pos = torch.tensor(positions, dtype=torch.long, device=dev)
        batch = Batch(self.kv, self.attn, False, torch.tensor(write_slot, dtype=torch.long, device=dev), pos)

        rows = sorted((i for i, s in enumerate(segments) if s.q == 1), key=lambda i: segments[i].slot)
        if rows:
            lo, hi = segments[rows[0]].slot, segments[rows[-1]].slot
            kmax = max(segments[i].cached for i in rows) + 1
            lens = [kmax] * (hi - lo + 1)  # holes see every column
            for i in rows:
                lens[segments[i].slot - lo] = segments[i].cached + 1
            mask = None
            if min(lens) < kmax:
                blocked = torch.arange(kmax)[None, :] >= torch.tensor(lens)[:, None]
                mask = _additive(blocked.to(dev), self.dtype)[:, None, None, :]
            place = None
            if hi - lo + 1 > len(rows):
                place = torch.tensor([segments[i].slot - lo for i in rows], dtype=torch.long, device=dev)
            batch.decodes = DecodeRows(_as_index([starts[i] for i in rows], dev), slice(lo, hi + 1), place,
                                     kmax, mask)
        for i, s in enumerate(segments):
            if s.q > 1:
                mask = None
                if s.cached:
                    blocked = torch.ones(s.q, s.cached + s.q, dtype=torch.bool,
                                         device=dev).triu_(s.cached + 1)
                    mask = self._fold(_additive(blocked, self.dtype)[None, None])
                batch.prefills.append(PrefillSegment(starts[i], s.q, s.slot, s.cached, mask))
        kwargs = {"input_ids": self._token_tensor(segments)[None], "position_ids": pos[None],
                  BATCH_KWARG: batch}
        return kwargs, torch.tensor(sampled, dtype=torch.long, device=dev)

    def prepare_binpacked(self, rows: Sequence[Sequence[Segment]], length: int, dense: bool = True
                          ) -> tuple[dict[str, Any], torch.Tensor]:
        """Model-forward kwargs for bin-packed prompts (`rows[b]`: the segments packed back to back in row b,
        each from position 0, then pads up to `length`), and the (row, column) of each sampled token in
        row order. `dense`: one masked block per row, the mask letting a token see only the earlier tokens of
        its own prompt (a pad sees itself); else causal attention over each prompt's own span (varlen)."""
        flat = [s for row in rows for s in row]
        if any(s.cached for s in flat) or any(sum(s.q for s in row) > length for row in rows):
            raise ValueError("bin-packed rows take whole prompts (nothing cached) within the row length")
        self._check(flat)
        dev = self.device
        B, L = len(rows), int(length)
        ids = torch.zeros(B, L, dtype=torch.long)
        pos = torch.zeros(B, L, dtype=torch.long)
        owner = torch.arange(B * L).reshape(B, L) + B * L  # pads: a prompt id of their own
        real, write_slot, write_pos, sampled, spans = [], [], [], [], []
        for b, row in enumerate(rows):
            start = 0
            for i, s in enumerate(row):
                end = start + s.q
                ids[b, start:end] = torch.as_tensor(s.tokens, dtype=torch.long).reshape(-1)
                pos[b, start:end] = torch.arange(s.q)
                owner[b, start:end] = i
                real.extend(range(b * L + start, b * L + end))
                write_slot.extend([s.slot] * s.q)
                write_pos.extend(range(s.q))
                if s.sample:
                    sampled.append((b, end - 1))
                spans.append((b, start, s.q))
                start = end
        batch = Batch(self.kv, self.attn, True, torch.tensor(write_slot, dtype=torch.long, device=dev),
                       torch.tensor(write_pos, dtype=torch.long, device=dev),
                       real=torch.tensor(real, dtype=torch.long, device=dev))
        if dense:
            cols = torch.arange(L)
            blocked = (owner[:, :, None] != owner[:, None, :]) | (cols[None, None, :] > cols[None, :, None])
            batch.mask = self._fold(_additive(blocked.to(dev), self.dtype)[:, None])
        else:
            batch.spans = spans
        kwargs = {"input_ids": ids.to(dev, non_blocking=True), "position_ids": pos.to(dev),
                  BATCH_KWARG: batch}
        return kwargs, torch.tensor(sampled, dtype=torch.long, device=dev).reshape(-1, 2)

    def prepare_padded(self, segments: Sequence[Segment], length: int | None = None,
                       kv_len: int | None = None, dense: bool = False) -> tuple[dict[str, Any], torch.Tensor]:
        """Model-forward kwargs for a padded `[B, L]` iteration (row i = segments[i], right-padded to L),
        and the (row, column) indices of the sampled tokens."""
        L = max(s.q for s in segments) if length is None else int(length)
        if any(s.q > L for s in segments):
            raise ValueError(f"length {L} is shorter than a segment")
        self._check(segments, L)
        dev = self.device
        B = len(segments)
        cached = torch.tensor([s.cached for s in segments], dtype=torch.long, device=dev)
        cols = torch.arange(L, device=dev)
        pos = cached[:, None] + cols[None, :]  # [B, L]
        kmax = max(s.cached for s in segments) + L
        if kv_len is not None:
            if kv_len < kmax or kv_len > self.max_len:
                raise ValueError(f"kv_len {kv_len} outside {kmax}..{self.max_len}")
            kmax = int(kv_len)
        slots = [s.slot for s in segments]
        batch = Batch(self.kv, self.attn, True, torch.tensor(slots, dtype=torch.long, device=dev)[:, None],
                       pos, slots=_as_index(slots, dev), kmax=kmax)
        if all(s.cached == 0 for s in segments) and kmax == L and not dense:
            batch.is_causal = True  # right padding: real queries only ever see real keys
        elif L == 1 and all(s.cached + 1 == kmax for s in segments):
            pass  # one new token per row, every row sees all kmax columns
        else:
            blocked = torch.arange(kmax, device=dev)[None, None, :] > pos[:, :, None]  # [B, L, kmax]
            batch.mask = self._fold(_additive(blocked, self.dtype)[:, None])
        ids = torch.zeros(B, L, dtype=torch.long)
        for i, s in enumerate(segments):
            ids[i, :s.q] = torch.as_tensor(s.tokens, dtype=torch.long).reshape(-1)
        kwargs = {"input_ids": ids.to(dev, non_blocking=True), "position_ids": pos, BATCH_KWARG: batch}
        sampled = [(i, s.q - 1) for i, s in enumerate(segments) if s.sample]
        return kwargs, torch.tensor(sampled, dtype=torch.long, device=dev).reshape(-1, 2)

    # ---- execution ----------------------------------------------------------------------------------
    def forward_hidden(self, kwargs: dict[str, Any]) -> torch.Tensor:
        """The model's last hidden states for `prepare*`'s kwargs (what a decode graph captures too)."""
        with sdpa_kernel(list(self.attn.backends)):
            return self.model.model(use_cache=False, **kwargs).last_hidden_state

    def run(self, segments: Sequence[Segment]) -> torch.Tensor:
        """One ragged iteration; returns the logits `[n_sampled, vocab]` of the last token of each sampled
        segment, in segment order. A decode-only step runs from its CUDA graph when the executor has them."""
        graphs = self.graphs
        if graphs is not None and (key := graphs.bucket(segments)) is not None:
            self._check(segments)
            return graphs.run(segments, key)
        with torch.inference_mode():
            kwargs, rows = self.prepare(segments)
            hidden = self.forward_hidden(kwargs)[0]  # [T, hidden]
            return self.model.lm_head(hidden.index_select(0, rows))

    def run_padded(self, segments: Sequence[Segment], length: int | None = None,
                   kv_len: int | None = None, dense: bool = False) -> torch.Tensor:
        """One padded iteration: B = len(segments) rows x L columns (pads computed), attention over
        `kv_len` KV columns per row (default: the longest row's); `dense`: under an explicit mask even where
        a causal kernel would do (Hugging Face's padding mask). Returns the logits of the last real token
        of each sampled segment, in segment order."""
        with torch.inference_mode():
            kwargs, rc = self.prepare_padded(segments, length, kv_len, dense)
            hidden = self.forward_hidden(kwargs)  # [B, L, hidden]
            return self.model.lm_head(hidden[rc[:, 0], rc[:, 1]])

    def run_binpacked(self, rows: Sequence[Sequence[Segment]], length: int,
                      dense: bool = True) -> torch.Tensor:
        """One bin-packed prefill (`prepare_binpacked`): the logits of each sampled prompt's last token, in
        row order."""
        with torch.inference_mode():
            kwargs, rc = self.prepare_binpacked(rows, length, dense)
            hidden = self.forward_hidden(kwargs)  # [B, L, hidden]
            return self.model.lm_head(hidden[rc[:, 0], rc[:, 1]])

    def move_slot(self, src: int, dst: int, positions: int) -> None:
        """Copy the first `positions` KV positions of slot `src` into slot `dst` (every layer, K and V)."""
        with torch.inference_mode():
            self.kv[:, :, dst, :, :positions] = self.kv[:, :, src, :, :positions]

    def slot_kv(self, slot: int, positions: int) -> torch.Tensor:
        """A view of the first `positions` KV positions of `slot`: `[layer, 2, kv_head, position,
        head_dim]`."""
        return self.kv[:, :, slot, :, :positions]

    def load_slot(self, slot: int, kv: torch.Tensor) -> None:
        """Write a request's KV (`slot_kv`'s layout, from another executor) into `slot` from position 0."""
        with torch.inference_mode():
            self.kv[:, :, slot, :, :kv.shape[3]] = kv

    def clear(self) -> None:
        """Zero the slab (not needed for correctness: a segment only reads positions below c + q)."""
        with torch.inference_mode():
            self.kv.zero_()


def attention_kernels(model: torch.nn.Module, config: ExecutorConfig = DEFAULT_CONFIG) -> dict[str, str]:
    """The SDPA kernel each kind of attention call runs under `config` on `model`'s device, dtype and heads,
    e.g. {"decode_masked": "efficient (folded)", ...}, for meta.json and summary.json: small iterations of
    every kind (prompts, decode rows of one and of mixed lengths, a chunk on cached context, padded and
    bin-packed batches) run through the executor while `noting_kernels` notes torch's choice for
    each kind. InputError when the configuration has no kernel for one."""
    ex = RaggedExecutor(model, 4, 16, config)
    one = [0]
    with noting_kernels() as seen:
        try:
            ex.run([Segment(0, [0] * 5), Segment(1, [0] * 3)])  # prompts
            ex.run([Segment(0, one, 5), Segment(1, one, 3), Segment(2, [0] * 2, 4)])  # mixed decodes, a chunk
            ex.run([Segment(0, one, 6), Segment(1, one, 6)])  # decode rows of one length
            ex.run_padded([Segment(0, [0] * 3), Segment(1, [0] * 2)])  # a padded prefill
            ex.run_padded([Segment(0, one, 7), Segment(1, one, 7)], length=1)  # a padded decode of one length
            ex.run_padded([Segment(0, [0] * 2, 8), Segment(1, one, 4)])  # padded rows under a mask
            for dense in (True, False):
                ex.run_binpacked([[Segment(2, [0] * 2), Segment(3, [0] * 3)]], 6, dense=dense)
        except RuntimeError as e:
            kind = next(reversed(seen), "some") if seen else "some"
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            allowed = ", ".join(config.backends(ex.device.type))
            raise InputError(f"--attention {config.attention} ({allowed}) has no kernel for {kind} attention "
                             f"on {ex.device} in {str(ex.dtype).removeprefix('torch.')}: {first}") from None
    return dict(sorted(seen.items()))
