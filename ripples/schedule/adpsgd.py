"""AD-PSGD's pairing with the active/passive split, as a schedule.

Even ranks are active, odd ranks passive. After step ``s`` every active rank picks one
passive partner at random from the seed shared by all ranks; a passive rank averages with
every active rank that picked it, in increasing active rank. Because every pair joins an
active and a passive rank (a bipartite graph) and carries the global sequence number
``s * actives + index of the active rank``, no waiting cycle can form.
"""
from __future__ import annotations

from typing import List

import numpy as np

from .base import Assignment, Schedule, check_int, check_world


def adpsgd_pairs(seed: int, step: int, size: int) -> List[Assignment]:
    """All ``(seq, pair)`` pairs (``pair`` sorted, one active and one passive rank) of step ``step``, in increasing ``seq``.

    Empty when ``size < 2`` (no passive rank to pair with)."""
    check_int("seed", seed, low=0)
    check_int("step", step, low=0)
    check_int("size", size, low=1)
    actives = list(range(0, size, 2))
    passives = list(range(1, size, 2))
    if not passives:
        return []
    picks = np.random.default_rng([seed, step]).integers(0, len(passives), size=len(actives))
    base = step * len(actives)
    return [(base + i, tuple(sorted((active, passives[int(pick)]))))
            for i, (active, pick) in enumerate(zip(actives, picks))]


class AdpsgdSchedule(Schedule):
    """This rank's pairs of :func:`adpsgd_pairs`: one for an active rank, zero or more for
    a passive rank."""

    def __init__(self, rank: int, size: int, seed: int):
        check_world(rank, size)
        check_int("seed", seed, low=0)
        super().__init__(rank, size)
        self.seed = seed

    def groups_for_step(self, step: int) -> List[Assignment]:
        self._check_step(step)
        return [(seq, pair) for seq, pair in adpsgd_pairs(self.seed, step, self.size)
                if self.rank in pair]
