"""How a shape's repetitions run (`ShapeProtocol`): `served` (the default) moves every cached context by a
few tokens from call to call, symmetric around the shape, and its segments over the slab's rows, as serving
does (no cache keyed on the shape stays warm); `fixed` repeats the shape. Either way a profile row's features
are the nominal shape's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from simctl.profiler.shapes import Shape

PROTOCOLS = ("served", "fixed")


@dataclass(frozen=True, slots=True)
class Repetitions:
    """The calls that time one shape: call j runs `shape.shifted(offset(j))` with its segments in the slab
    rows base(j) .. base(j) + slots - 1 (packed, in segment order, as the engine's `SlotPool` keeps them), on
    a slab of `slab` = (rows, positions) that holds every call."""

    shape: Shape
    radius: int  # contexts move within [c - radius, c + radius]
    spare_slots: int  # slab rows beyond the shape's: the first segment's row cycles through 0..spare_slots

    def offset(self, j: int) -> int:
        """0, +1, -1, +2, -2, ..., +radius, -radius, then again: no KV length repeats within 2 radius + 1
        calls, and every odd-length run of calls from the start is symmetric around the nominal shape (an
        even one is half a token above it)."""
        k = j % (2 * self.radius + 1)
        return (k + 1) // 2 if k % 2 else -(k // 2)

    def call(self, j: int) -> tuple[Shape, int]:
        """Call j's shape and the slab row of its first segment."""
        return self.shape.shifted(self.offset(j)), j % (self.spare_slots + 1)

    @property
    def slab(self) -> tuple[int, int]:
        return self.shape.slots + self.spare_slots, self.shape.shifted(self.radius).max_len

    @property
    def kv_tokens(self) -> int:
        slots, max_len = self.slab
        return slots * max_len


@dataclass(frozen=True, slots=True)
class ShapeProtocol:
    """How a shape's repetitions are laid out. `served` (the default) varies them as serving does, so that no
    cache keyed on a shape (an attention plan cache keyed on the KV length, a tensor left hot in a CPU cache
    by the previous call) flatters the profile: every cached context moves by a few tokens from call to call
    (`Repetitions.offset`), within `max_offset` tokens and `offset_share` of the shortest cached context and
    within the model's positions, and the segments' slab rows move by one each call over `spare_slots` extra
    rows; the slab is longer than the shape's KV, as the engine's slab is (so a decode reads a strided view of
    it). The offsets are symmetric around the shape, and time is close to linear in a few tokens of
    context, so the median repetition (`time_s`) is the nominal shape's time and the recorded features
    stay the nominal shape's, which are those of the mean call too (every feature is linear in the
    contexts). `fixed` times the same shape in the same rows every call (the profiler before issue 11), to
    see what the caches give."""

    name: Literal["served", "fixed"] = "served"
    # +-64 tokens: 129 KV lengths before one repeats, most of the calls of a shape (up to max_reps = 160 and a
    # warm-up a block) where contexts allow it (an eighth of 512 tokens and up)
    max_offset: int = 64
    offset_share: float = 0.125
    spare_slots: int = 3

    def __post_init__(self) -> None:
        if self.name not in PROTOCOLS:
            raise ValueError(f"unknown shape protocol {self.name!r}; choose one of {', '.join(PROTOCOLS)}")

    def repetitions(self, shape: Shape, max_position: int, max_kv_tokens: int | None = None) -> Repetitions:
        """`shape`'s calls, within the model's positions and a slab of at most `max_kv_tokens` (the grid's
        budget, which `shape` fits): where the budget is tight the spare rows give way first (the KV lengths
        are what a cache keys on), then the radius, so a shape the fixed protocol times is timed here too
        (`meta.json` lists the ones whose contexts stay fixed)."""
        if self.name == "fixed":
            return Repetitions(shape, 0, 0)
        cached = [s.c for s in shape.segs if s.c]
        radius = min(self.max_offset, int(min(cached) * self.offset_share),
                     max_position - shape.max_len) if cached else 0
        spare = self.spare_slots
        if max_kv_tokens is not None:
            radius = min(radius, max_kv_tokens // shape.slots - shape.max_len)
            spare = min(spare, max_kv_tokens // shape.shifted(max(radius, 0)).max_len - shape.slots)
        return Repetitions(shape, max(radius, 0), max(spare, 0))

    def meta(self) -> dict[str, object]:
        """What meta.json records (`shape_protocol`)."""
        if self.name == "fixed":
            return {"name": "fixed",
                    "description": "every repetition runs the same shape in the same slab rows"}
        return {"name": self.name, "max_offset": self.max_offset, "offset_share": self.offset_share,
                "spare_slots": self.spare_slots,
                "description": "call j moves every cached context (c > 0) and padded KV width by 0, +1, -1, "
                               "+2, -2, ... up to min(max_offset, offset_share x the shortest cached "
                               "context, positions left) tokens, then repeats; its segments take slab rows b "
                               ".. b + n - 1 with b = j mod (spare_slots + 1); features are the nominal "
                               "shape's"}


SERVED = ShapeProtocol()  # the default
