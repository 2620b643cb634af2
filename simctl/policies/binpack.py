"""First-Fit Decreasing bin packing (Prepacking, Section 3.1): the prompts of a batch into the fewest bins of
`capacity` tokens that the heuristic finds; at most 11/9 OPT + 6/9 bins (Dosa, 2007)."""

from __future__ import annotations


def first_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """Indices into `lengths`, grouped into bins whose lengths sum to at most `capacity`: longest first, each
    into the first bin it fits, a new bin when none does. Ties keep their order (the packing is
    deterministic)."""
    if any(n > capacity or n < 0 for n in lengths):
        raise ValueError(f"every length must be in 0..{capacity}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        n = lengths[i]
        for b, free in enumerate(room):
            if n <= free:
                bins[b].append(i)
                room[b] -= n
                break
        else:
            bins.append([i])
            room.append(capacity - n)
    return bins
