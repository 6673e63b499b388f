"""Conflict-free schedules computed by every rank alone: the generalized static (Prague)
schedule and a random partition drawn from a shared seed."""
from __future__ import annotations

from typing import List

import numpy as np

from .base import Assignment, Group, Schedule, check_group_size, check_int, check_world


def static_partition(step: int, size: int, local_size: int) -> List[Group]:
    """The groups of step ``step`` for ``size`` ranks placed ``local_size`` per node.

    Ranks are numbered node by node (rank = node * local_size + local rank); the last node
    may hold fewer ranks. The schedule alternates two kinds of step:

    * odd steps: every node is one group (intra-node averaging);
    * even step ``2j``: the representative local rank ``r = j mod local_size`` of every
      node forms one cross-node group; on each node the other local ranks, taken in cyclic
      order ``r+1, r+2, ...``, are paired consecutively, and when their count is odd the
      first of them (``r+1``) stays alone.

    For ``local_size = 4`` steps 0-3 are exactly the published schedule (step 0: local
    rank 0 across nodes, 1 alone, 2 and 3 pair; step 2: local rank 1 across nodes, 2 alone,
    0 and 3 pair). The published pattern then repeats with representatives 0 and 1 only;
    here the representative keeps rotating through all local ranks (period
    ``2 * local_size``) so every local rank carries cross-node traffic equally. A single node
    is the same rule (the cross-node group is the representative alone). With
    ``local_size = 1`` there is nothing inside a node, so every step is one group of all
    ranks. Every step is a partition of all ranks, hence conflict-free.
    """
    check_int("step", step, low=0)
    check_int("size", size, low=1)
    check_int("local_size", local_size, low=1)
    if local_size == 1:
        return [tuple(range(size))]
    nodes = [range(start, min(start + local_size, size)) for start in range(0, size, local_size)]
    if step % 2 == 1:
        return [tuple(node) for node in nodes]
    rep = (step // 2) % local_size
    groups: List[Group] = []
    cross = tuple(node[rep] for node in nodes if rep < len(node))
    if cross:
        groups.append(cross)
    for node in nodes:
        count = len(node)
        others = [node[(rep + i) % count] for i in range(1, count)] if rep < count \
            else [node[(rep + i) % count] for i in range(count)]
        if len(others) % 2 == 1:
            groups.append((others[0],))
            others = others[1:]
        groups.extend(tuple(sorted(others[i:i + 2])) for i in range(0, len(others), 2))
    return sorted(groups)


def random_partition(seed: int, step: int, size: int, group_size: int) -> List[Group]:
    """A uniformly random partition of ``range(size)`` into groups of ``group_size`` (the
    last group holds the remainder), the same on every rank for the same
    ``(seed, step)``: it depends on nothing else, so no communication is needed."""
    check_int("seed", seed, low=0)
    check_int("step", step, low=0)
    check_int("size", size, low=1)
    check_group_size(group_size, size)
    order = np.random.default_rng([seed, step]).permutation(size).tolist()
    return sorted(tuple(sorted(order[i:i + group_size])) for i in range(0, size, group_size))


def assignment_of(rank: int, step: int, partition: List[Group]) -> Assignment:
    """The ``(seq, group)`` of ``rank`` in the sorted ``partition`` of step ``step``.

    ``seq = step * size + index of the group``, unique per group and increasing with the
    step (a partition of ``size`` ranks has at most ``size`` groups)."""
    size = sum(len(group) for group in partition)
    for index, group in enumerate(partition):
        if rank in group:
            return step * size + index, group
    raise ValueError(f"rank {rank} is in no group of the partition {partition}")


class StaticSchedule(Schedule):
    """One group per step from :func:`static_partition` (``seq`` from :func:`assignment_of`)."""

    kind = "static"

    def __init__(self, rank: int, size: int, local_size: int):
        check_world(rank, size)
        check_int("local_size", local_size, low=1)
        super().__init__(rank, size)
        self.local_size = local_size

    def settings(self) -> dict:
        return {**super().settings(), "local_size": self.local_size}

    def groups_for_step(self, step: int) -> List[Assignment]:
        self._check_step(step)
        return [assignment_of(self.rank, step,
                              static_partition(step, self.size, self.local_size))]


class RandomSchedule(Schedule):
    """One group per step from :func:`random_partition` (``seq`` from :func:`assignment_of`).

    It draws from ``(seed, step)`` alone and keeps no generator state between steps, so
    the step count is all a resumed run needs to draw the same partitions."""

    kind = "random"

    def __init__(self, rank: int, size: int, group_size: int, seed: int):
        check_world(rank, size)
        check_group_size(group_size, size)
        check_int("seed", seed, low=0)
        super().__init__(rank, size)
        self.group_size = group_size
        self.seed = seed

    def settings(self) -> dict:
        return {**super().settings(), "group_size": self.group_size, "seed": self.seed}

    def groups_for_step(self, step: int) -> List[Assignment]:
        self._check_step(step)
        partition = random_partition(self.seed, step, self.size, self.group_size)
        return [assignment_of(self.rank, step, partition)]
