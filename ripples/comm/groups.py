"""Groups of ranks and the per-rank cache of their communicators.

A group is a sorted tuple of world ranks. Its communicator is made with MPI-3
``Comm.Create_group``, which involves the members only, and kept in a least-recently-used
cache of bounded capacity. Eviction is a local decision: the control exchange before every
collective (``ripples.comm.control``) tells all members to rebuild together when any one
of them no longer holds the communicator, so members never disagree on it.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Optional, Tuple

from mpi4py import MPI

Group = Tuple[int, ...]


def normalize_group(group: Iterable[int], rank: int, size: int, argument: str = "group") -> Group:
    """Return ``group`` as a sorted tuple, checking it contains ``rank`` and valid, distinct ranks."""
    try:
        members = [int(r) for r in group]
    except TypeError:
        raise TypeError(f"{argument} must be an iterable of ranks, got {group!r}") from None
    if len(set(members)) != len(members):
        raise ValueError(f"{argument}={tuple(members)} lists a rank twice (on rank {rank})")
    bad = [r for r in members if not 0 <= r < size]
    if bad:
        raise ValueError(f"{argument}={tuple(members)} has rank(s) {bad} outside 0..{size - 1} "
                         f"(on rank {rank})")
    if rank not in members:
        raise ValueError(f"rank {rank} called a collective on {argument}={tuple(sorted(members))} "
                         "that does not contain it; only members may call it")
    return tuple(sorted(members))


class CommunicatorCache:
    """Group communicators of one rank, least recently used evicted beyond ``capacity``.
    """

    def __init__(self, world: MPI.Comm, capacity: int, on_free=None):
        self._world = world
        self._on_free = on_free or (lambda group: None)
        self._capacity = capacity
        self._entries: "OrderedDict[Group, MPI.Comm]" = OrderedDict()
        self.created = 0
        self.evicted = 0

    def lookup(self, group: Group) -> Optional[MPI.Comm]:
        """The cached communicator of ``group``, or None (marks it recently used)."""
        comm = self._entries.get(group)
        if comm is not None:
            self._entries.move_to_end(group)
        return comm

    def create(self, group: Group) -> MPI.Comm:
        """Build ``group``'s communicator; every member must call this together."""
        self.discard(group)
        mpi_group = self._world.Get_group().Incl(list(group))
        try:
            comm = self._world.Create_group(mpi_group)
        finally:
            mpi_group.Free()
        self.created += 1
        self._entries[group] = comm
        while len(self._entries) > self._capacity:
            victim_group, victim = self._entries.popitem(last=False)
            self._on_free(victim_group)
            victim.Free()
            self.evicted += 1
        return comm

    def discard(self, group: Group) -> None:
        comm = self._entries.pop(group, None)
        if comm is not None:
            self._on_free(group)
            comm.Free()

    def __len__(self) -> int:
        return len(self._entries)

    def groups(self):
        return list(self._entries)

    def comms(self):
        """The cached communicators (to revoke them when a member died)."""
        return list(self._entries.values())

    def close(self) -> None:
        for group, comm in self._entries.items():
            self._on_free(group)
            comm.Free()
        self._entries.clear()
