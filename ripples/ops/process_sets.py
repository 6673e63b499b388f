"""Process sets: collectives among a fixed subset of ranks (Horovod's ``ProcessSet``).

Unlike Horovod, creating a set needs only its members: the set's communicator is made with
``Comm.Create_group`` at its first collective, by its members alone.
"""
from __future__ import annotations

from typing import Iterable, Optional, Tuple

from ripples import runtime as _runtime


class ProcessSet:
    """A set of world ranks. ``ProcessSet(None)`` is the global set (every rank)."""

    def __init__(self, ranks: Optional[Iterable[int]] = None):
        if ranks is None:
            self.ranks: Optional[Tuple[int, ...]] = None
            return
        members = sorted(int(r) for r in ranks)
        if not members:
            raise ValueError("ProcessSet(ranks) needs at least one rank")
        if len(set(members)) != len(members):
            raise ValueError(f"ProcessSet(ranks={members}) lists a rank twice")
        if members[0] < 0:
            raise ValueError(f"ProcessSet(ranks={members}) has a negative rank")
        self.ranks = tuple(members)

    def group(self) -> Tuple[int, ...]:
        """The sorted world ranks of the set (checked against the world size)."""
        rt = _runtime.current()
        if self.ranks is None:
            return rt.world_group
        if self.ranks[-1] >= rt.size:
            raise ValueError(f"process set {self.ranks} has ranks beyond the world size {rt.size}")
        return self.ranks

    def included(self) -> bool:
        return _runtime.current().rank in self.group()

    def size(self) -> int:
        return len(self.group())

    def rank(self) -> int:
        """This rank's index inside the set, or -1 if it is not a member."""
        group = self.group()
        me = _runtime.current().rank
        return group.index(me) if me in group else -1

    def __repr__(self) -> str:
        return "ProcessSet(global)" if self.ranks is None else f"ProcessSet({list(self.ranks)})"


global_process_set = ProcessSet(None)


def add_process_set(ranks) -> ProcessSet:
    """Create a process set of ``ranks`` (a ``ProcessSet`` or an iterable of world ranks)."""
    return ranks if isinstance(ranks, ProcessSet) else ProcessSet(ranks)


def remove_process_set(process_set: ProcessSet) -> None:
    """Free the set's communicator on this rank (it is rebuilt if the set is used again)."""
    if process_set.ranks is not None:
        _runtime.current().cache.discard(process_set.ranks)
