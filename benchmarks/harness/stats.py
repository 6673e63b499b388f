"""Summaries quoted by the benchmarks: medians over repeats, ratios against a reference
measured in the same run, the slowest rank of each iteration."""
from __future__ import annotations

import math
import statistics
from typing import Callable, Iterable, List, Optional, Sequence


def median(values: Iterable[float]) -> float:
    """The median of ``values`` (at least one)."""
    return statistics.median(list(values))


def ratio(value: Optional[float], reference: Optional[float]) -> float:
    """``value / reference``; NaN where either is missing or the reference is zero."""
    if value is None or reference is None or reference == 0:
        return math.nan
    return value / reference


def percentile(values: Sequence[float], fraction: float) -> Optional[float]:
    """The value below which ``fraction`` of ``values`` lie (nearest rank); None if empty."""
    ordered = sorted(values)
    if not ordered:
        return None
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def slowest_per_iteration(per_rank: Sequence[Sequence[float]]) -> List[float]:
    """Iteration ``i`` lasts as long as its slowest rank: the max over ranks of each
    column of ``per_rank[rank][i]``."""
    return [max(column) for column in zip(*per_rank)]


def median_run(runs: Sequence, key: Callable) -> object:
    """The run whose ``key`` is the median (the upper one of an even count): a whole
    repeat kept, so that its numbers stay consistent with each other."""
    return sorted(runs, key=key)[len(runs) // 2]
