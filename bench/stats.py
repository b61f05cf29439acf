"""Latency statistics of a list of samples, shared by the benches' reports."""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass
class Stats:
    n: int
    mean: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Stats:
        ordered = sorted(samples_ms)
        if len(ordered) == 1:
            only = ordered[0]
            return cls(1, only, only, only, only, only, only)
        cuts = statistics.quantiles(ordered, n=100, method="inclusive")
        return cls(len(ordered), statistics.fmean(ordered), cuts[49], cuts[94], cuts[98], ordered[0], ordered[-1])
