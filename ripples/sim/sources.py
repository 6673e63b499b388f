"""Where the simulated workers get their groups: the real schedule code, with the
simulator's clock.

* per-step schedules call the pure functions real ranks call (:func:`static_partition`,
  :func:`random_partition`, :func:`adpsgd_pairs`) once per step for all workers, with the
  same sequence numbers as :func:`ripples.schedule.static.assignment_of`;
* the generator is a real :class:`GroupGenerator` whose clock is the simulator's.
"""
from __future__ import annotations

import collections
from typing import Callable, Dict, List

from ..schedule import GroupGenerator, adpsgd_pairs, random_partition, static_partition
from ..schedule.base import Assignment
from .scenario import Scenario


class PerStep:
    """The assignments of every worker for a step, computed once per step and dropped
    when every worker has taken its own."""

    def __init__(self, scenario: Scenario):
        n, s = scenario.workers, scenario
        self.size = n
        if s.mode == "allreduce":
            everyone = tuple(range(n))
            self._make = lambda step: {w: [(step, everyone)] for w in range(n)}
        elif s.mode == "adpsgd-sync":
            self._make = lambda step: self._by_worker(adpsgd_pairs(s.seed, step, n))
        else:
            partition: Callable[[int], list] = (
                (lambda step: static_partition(step, n, s.network.workers_per_node))
                if s.mode == "static" else
                (lambda step: random_partition(s.seed, step, n, s.group_size)))
            self._make = lambda step: self._by_worker(
                [(step * n + i, g) for i, g in enumerate(partition(step))])
        self._steps: Dict[int, Dict[int, List[Assignment]]] = {}
        self._taken = collections.Counter()

    @staticmethod
    def _by_worker(assignments: List[Assignment]) -> Dict[int, List[Assignment]]:
        out: Dict[int, List[Assignment]] = collections.defaultdict(list)
        for seq, group in assignments:
            for w in group:
                out[w].append((seq, group))
        return out

    def groups(self, worker: int, step: int) -> List[Assignment]:
        """``worker``'s assignments after its local step ``step`` (0-based), in order."""
        table = self._steps.get(step)
        if table is None:
            table = self._steps[step] = self._make(step)
        self._taken[step] += 1
        if self._taken[step] == self.size:
            del self._steps[step], self._taken[step]
        return table.get(worker, [])


def make_generator(scenario: Scenario, clock: Callable[[], float]) -> GroupGenerator:
    """The real Group Generator for the scenario, on the simulator's clock."""
    by_node = scenario.mode == "generator-node"
    return GroupGenerator(scenario.workers, scenario.group_size, seed=scenario.seed,
                          policy=scenario.policy, batch=scenario.batch, clock=clock,
                          ranks_per_node=scenario.network.workers_per_node if by_node else None,
                          cross_node_every=scenario.cross_node_every)
