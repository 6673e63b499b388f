"""Runs of several modes and worker counts of one setting, with a common target.

The target loss of a run with ``P`` workers is the test loss that all-reduce reaches after
``target_steps`` synchronous steps of ``P`` workers (from :func:`allreduce_loss_curve`,
with the same problem): the synthetic problem's difficulty is expressed in all-reduce steps,
so every mode is judged by the same bar.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Iterable, List, Optional

from .engine import RunResult, simulate
from .scenario import Scenario
from .stats import allreduce_loss_curve


def target_loss(scenario: Scenario, target_steps: int) -> float:
    """The loss all-reduce reaches after ``target_steps`` steps of ``scenario.workers``."""
    if target_steps < 1:
        raise ValueError(f"target_steps must be >= 1, got {target_steps!r}")
    return _target(scenario.problem, scenario.workers, target_steps, scenario.seed)


@functools.lru_cache(maxsize=64)
def _target(problem, workers: int, target_steps: int, seed: int) -> float:
    # Every mode of a setting shares its target; computing it costs as much as a short run.
    return float(allreduce_loss_curve(problem, workers, target_steps, seed=seed)[-1])


def run_modes(base: Scenario, modes: Iterable[str], target_steps: Optional[int] = None,
              progress: Optional[Callable[[str], Callable[[float], None]]] = None
              ) -> List[RunResult]:
    """One run per mode of ``base`` (with ``base.target_loss`` replaced by the target of
    ``target_steps`` when given). ``progress(label)`` returns the per-run callback."""
    if target_steps is not None:
        base = dataclasses.replace(base, target_loss=target_loss(base, target_steps))
    results = []
    for mode in modes:
        scenario = dataclasses.replace(base, mode=mode)
        callback = progress(f"{base.workers} workers {mode}") if progress else None
        results.append(simulate(scenario, callback))
    return results


def sweep(base: Scenario, modes: Iterable[str], worker_counts: Iterable[int],
          target_steps: Optional[int] = None, progress=None) -> List[RunResult]:
    """:func:`run_modes` for every worker count."""
    modes = list(modes)
    results = []
    for workers in worker_counts:
        scenario = dataclasses.replace(base, workers=workers,
                                       group_size=min(base.group_size, workers))
        results.extend(run_modes(scenario, modes, target_steps, progress))
    return results
