"""Per-rank training metrics: throughput, communication wait, groups joined, consensus distance.

Pure bookkeeping: callers report what happened; nothing here talks to other ranks. Each rank
writes its own JSON file (``per_rank_path(path, rank)``: ``m.json`` -> ``m.rank3.json``).

Steps and communication wait are counted by the ``DistributedOptimizer``; samples are not,
since only the training script knows its batch size. A script reports them once per batch,
so that ``"samples"`` and ``"samples_per_s"`` in the ``--metrics`` JSON mean something::

    import ripples.observe.metrics
    for x, y in loader:
        ...
        opt.step()
        ripples.observe.metrics.record_samples(len(x))   # or: opt.metrics.add_samples(len(x))
"""
from __future__ import annotations

import contextlib
import json
import operator
import os
import time
import weakref
from collections import Counter
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple

from ripples.observe.timeline import per_rank_path

__all__ = ["RankMetrics", "record_samples"]

# The RankMetrics made last in this process (the current DistributedOptimizer's), weakly.
_latest: Optional["weakref.ReferenceType[RankMetrics]"] = None


def mean_group_size(groups_by_size: Mapping[int, float]) -> float:
    """Members per group of a ``{size: number of groups}`` count; 0.0 when it is empty."""
    groups = sum(groups_by_size.values())
    return sum(k * v for k, v in groups_by_size.items()) / groups if groups else 0.0


class RankMetrics:
    """Counters of one rank. Wall time runs from construction (or ``reset_clock()``) until
    ``stop()`` (or now, while running). ``clock`` is injectable for tests.
    """

    def __init__(self, rank: int, clock: Callable[[], float] = time.perf_counter):
        global _latest
        if not isinstance(rank, int) or rank < 0:
            raise ValueError(f"rank must be an integer >= 0, got {rank!r}")
        self.rank = rank
        self._clock = clock
        self.steps = 0
        self.samples = 0
        self.wait_s = 0.0
        self.groups_by_size: Counter = Counter()
        self.consensus: List[Tuple[int, float]] = []
        self._start = clock()
        self._stop: Optional[float] = None
        _latest = weakref.ref(self)

    def reset_clock(self) -> None:
        """Restart wall time now (e.g. after warm-up); counters are kept."""
        self._start = self._clock()
        self._stop = None

    def stop(self) -> None:
        """Freeze wall time at now."""
        self._stop = self._clock()

    @property
    def wall_s(self) -> float:
        end = self._clock() if self._stop is None else self._stop
        return max(0.0, end - self._start)

    def add_step(self, samples: int = 0) -> None:
        """Count one finished training step that processed ``samples`` samples."""
        self.add_samples(samples)
        self.steps += 1

    def add_samples(self, n: int) -> None:
        """Count ``n`` samples this rank processed (call once per batch with its size), for
        ``"samples"`` and ``"samples_per_s"``; steps are not counted."""
        self.samples += _sample_count(n)

    def add_wait(self, seconds: float) -> None:
        """Add time spent blocked in communication."""
        if not seconds >= 0:
            raise ValueError(f"seconds must be >= 0, got {seconds!r}")
        self.wait_s += seconds

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Count the enclosed block as communication wait."""
        start = self._clock()
        try:
            yield
        finally:
            self.add_wait(max(0.0, self._clock() - start))

    def add_group(self, size: int) -> None:
        """Count one group of ``size`` members that this rank joined (1 = alone)."""
        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be an integer >= 1, got {size!r}")
        self.groups_by_size[size] += 1

    def add_consensus(self, step: int, value: float) -> None:
        """Store a consensus-distance sample ``mean_i ||x_i - x_mean||^2`` taken at ``step``."""
        if not value >= 0:
            raise ValueError(f"value must be a number >= 0, got {value!r}")
        self.consensus.append((int(step), float(value)))

    def as_dict(self) -> Dict[str, Any]:
        """A JSON-ready summary. Rates are 0 when no wall time has passed."""
        wall = self.wall_s
        groups = sum(self.groups_by_size.values())
        return {
            "rank": self.rank,
            "steps": self.steps,
            "samples": self.samples,
            "wall_s": wall,
            "steps_per_s": self.steps / wall if wall > 0 else 0.0,
            "samples_per_s": self.samples / wall if wall > 0 else 0.0,
            "wait_s": self.wait_s,
            "wait_fraction": self.wait_s / wall if wall > 0 else 0.0,
            "groups": groups,
            "groups_by_size": {str(k): v for k, v in sorted(self.groups_by_size.items())},
            "mean_group_size": mean_group_size(self.groups_by_size),
            "consensus": [[step, value] for step, value in self.consensus],
        }

    def write_json(self, path: str) -> str:
        """Write ``as_dict()`` to ``per_rank_path(path, rank)`` and return that path."""
        target = per_rank_path(path, self.rank)
        os.makedirs(os.path.dirname(target) or ".", exist_ok=True)
        with open(target, "w", encoding="utf-8") as handle:
            json.dump(self.as_dict(), handle, indent=1)
        return target


def record_samples(n: int) -> None:
    """Count ``n`` samples (a batch's size) on this rank's current metrics: those of the
    ``DistributedOptimizer`` made last in this process, written to ``--metrics`` /
    ``RIPPLES_METRICS_PATH`` at shutdown. Call it once per batch::

        opt.step()
        ripples.observe.metrics.record_samples(len(batch))

    Does nothing while no optimizer (no ``RankMetrics``) exists, so a script can call it
    whether or not it trains through ripples. ValueError unless ``n`` is an integer >= 0.
    """
    count = _sample_count(n)
    current = _latest() if _latest is not None else None
    if current is not None:
        current.add_samples(count)


def _sample_count(n) -> int:
    """``n`` as an int (numpy and 0-d torch integers too); ValueError unless an integer >= 0."""
    try:
        count = operator.index(n)
    except TypeError:
        count = -1
    if isinstance(n, bool) or count < 0:
        raise ValueError(f"samples must be an integer >= 0, got {n!r}")
    return count
