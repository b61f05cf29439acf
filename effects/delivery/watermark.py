"""The watermark's normalized, non-overlapping interval map (pure; the service applies it under the domain lock).

An interval map is a sorted list of (start, end, generation) with half-open [start, end), no overlaps, and no two
adjacent intervals with the same generation (they are merged). `apply` raises every point of [start, end) to at
least `generation`: existing intervals are split at the new bounds, points already at a higher generation keep
it, gaps are filled, and equal neighbours are merged.
"""
from __future__ import annotations

from typing import Any

Interval = tuple[Any, Any, Any]  # (start, end, generation)


def normalize(intervals: list[Interval]) -> list[Interval]:
    out: list[Interval] = []
    for start, end, gen in sorted(i for i in intervals if i[0] < i[1]):
        if out and out[-1][1] > start:
            raise ValueError(f"overlapping intervals {out[-1]} and {(start, end, gen)}")
        if out and out[-1][1] == start and out[-1][2] == gen:
            out[-1] = (out[-1][0], end, gen)
        else:
            out.append((start, end, gen))
    return out


def apply(intervals: list[Interval], start, end, generation) -> list[Interval]:
    """The map after a full application of `generation` over [start, end)."""
    if not start < end:
        raise ValueError("empty or inverted range")
    points = sorted({start, end, *(p for s, e, _ in intervals for p in (s, e))})
    result: list[Interval] = []
    for left, right in zip(points, points[1:]):
        current = next((g for s, e, g in intervals if s <= left and right <= e), None)
        inside = start <= left and right <= end
        if inside:
            gen = generation if current is None or current < generation else current
        else:
            gen = current
        if gen is not None:
            result.append((left, right, gen))
    return normalize(result)


def highest_over(intervals: list[Interval], start, end):
    """The highest generation applied to any point of [start, end), or None."""
    gens = [g for s, e, g in intervals if s < end and start < e]
    return max(gens) if gens else None
