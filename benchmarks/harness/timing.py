"""Timing several calls side by side: one call of each in turn, every iteration, so that
the background load of a shared machine falls on every row alike."""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional


def interleaved(calls: Dict[str, Callable[[int], object]], iterations: int, warmup: int = 0,
                before: Optional[Callable[[int], object]] = None,
                after: Optional[Callable[[], object]] = None) -> Dict[str, List[float]]:
    """Seconds of every timed call of each of ``calls``: ``warmup`` untimed iterations,
    then ``iterations`` timed ones; in each, the calls in order, each called with the
    iteration number after ``before(i)`` (a barrier, a sleep: untimed) and followed by
    ``after()`` (a device synchronization: timed)."""
    times: Dict[str, List[float]] = {name: [] for name in calls}
    for i in range(warmup + iterations):
        for name, call in calls.items():
            if before is not None:
                before(i)
            start = time.perf_counter()
            call(i)
            if after is not None:
                after()
            if i >= warmup:
                times[name].append(time.perf_counter() - start)
    return times
