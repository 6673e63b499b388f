"""AD-PSGD's pairing with the active/passive split: the partner an active rank picks
(:func:`adpsgd_partner`, used by the asynchronous ``sync="adpsgd"``), and the lock-step pairs
of ``sync="adpsgd-sync"`` as a schedule.

Even ranks are active, odd ranks passive. In lock-step, after step ``s`` every active rank picks one
passive partner at random from the seed shared by all ranks; a passive rank averages with
every active rank that picked it, in increasing active rank. Because every pair joins an
active and a passive rank (a bipartite graph) and carries the global sequence number
``s * actives + index of the active rank``, no waiting cycle can form.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import numpy as np

from .base import Assignment, Schedule, check_int, check_world


def is_active(rank: int) -> bool:
    """Whether ``rank`` is an active rank (even ranks are; odd ranks are passive)."""
    check_int("rank", rank, low=0)
    return rank % 2 == 0


def adpsgd_roles(size: int, was_active: Optional[Sequence[bool]] = None
                 ) -> Tuple[List[int], List[int]]:
    """``(actives, passives)`` of a world of ``size`` ranks: even ranks, odd ranks.

    ``was_active`` (by rank of this world: whether each rank was active in the world it
    came from, after ranks died) keeps every rank's role, where that leaves at least one
    active and one passive rank. A rank that changed roles while it waits in ``join()``
    would change what happens to its model: a passive one is averaged until the active
    ranks end, an active one is not averaged any more."""
    check_int("size", size, low=1)
    if was_active is not None:
        if len(was_active) != size:
            raise ValueError(f"was_active has {len(was_active)} entries for a world of "
                             f"{size} ranks; give one per rank")
        actives = [r for r in range(size) if was_active[r]]
        passives = [r for r in range(size) if not was_active[r]]
        if actives and passives:
            return actives, passives
    return list(range(0, size, 2)), list(range(1, size, 2))


def adpsgd_partner(seed: int, rank: int, exchange: int, size: int,
                   passives: Optional[Sequence[int]] = None) -> Optional[int]:
    """The passive rank that active ``rank`` averages with in its ``exchange``-th exchange.

    Drawn uniformly from the passive ranks (``passives``; by default the odd ranks,
    ``adpsgd_roles(size)``) by a generator seeded with ``(seed, rank, exchange)``, so a run
    resumed with the same counters draws the same partners. None for a passive rank, and
    for rank 0 of a world of one (no passive rank: it trains alone)."""
    check_int("seed", seed, low=0)
    check_world(rank, size)
    check_int("exchange", exchange, low=0)
    if passives is None:
        _, passives = adpsgd_roles(size)
    if rank in passives or not passives:
        return None
    pick = np.random.default_rng([seed, rank, exchange]).integers(0, len(passives))
    return passives[int(pick)]


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

    kind = "adpsgd"

    def __init__(self, rank: int, size: int, seed: int):
        check_world(rank, size)
        check_int("seed", seed, low=0)
        super().__init__(rank, size)
        self.seed = seed

    def settings(self) -> dict:
        return {**super().settings(), "seed": self.seed}

    def groups_for_step(self, step: int) -> List[Assignment]:
        self._check_step(step)
        return [(seq, pair) for seq, pair in adpsgd_pairs(self.seed, step, self.size)
                if self.rank in pair]
