"""Process sets: collectives among a fixed subset of ranks (Horovod's ``ProcessSet``).

Unlike Horovod, creating a set needs only its members and no registration: the set's
communicator is made with ``Comm.Create_group`` at its first collective, by its members
alone. ``add_process_set`` and ``init(process_sets=...)`` only check the set and give it a
``process_set_id``, as Horovod does.
"""
from __future__ import annotations

import itertools
from typing import Dict, List, Optional, Tuple

from mpi4py import MPI

from ripples import runtime as _runtime


class ProcessSet:
    """A set of world ranks, from a list of ranks or an mpi4py communicator (whose members
    form the set). ``ProcessSet(None)`` is the global set (every rank).

    ``ranks`` is the sorted list of world ranks (for a communicator or the global set, known
    once ripples is initialized); ``process_set_id`` is 0 for the global set and assigned by
    ``add_process_set``/``init(process_sets=...)`` otherwise.
    """

    def __init__(self, ranks_or_comm=None):
        self.process_set_id: Optional[int] = None
        self._ranks: Optional[Tuple[int, ...]] = None
        self._generation: Optional[int] = None  # the world its ranks are of (Runtime.generation)
        self.mpi_comm: Optional[MPI.Comm] = None
        if ranks_or_comm is None:
            return
        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            members = sorted(ranks_or_comm)
        except TypeError:
            raise TypeError("ProcessSet takes a list of ranks or an mpi4py communicator, got "
                            f"{ranks_or_comm!r}") from None
        if any(isinstance(r, bool) or not isinstance(r, int) for r in members):
            raise ValueError(f"ProcessSet(ranks={members}) must list integer ranks")
        if not members:
            raise ValueError("ProcessSet(ranks) needs at least one rank")
        if len(set(members)) != len(members):
            raise ValueError(f"ProcessSet(ranks={members}) lists a rank twice")
        if members[0] < 0:
            raise ValueError(f"ProcessSet(ranks={members}) has a negative rank")
        self._ranks = tuple(members)

    @property
    def ranks(self) -> Optional[List[int]]:
        if self._ranks is None and _runtime.is_initialized():
            return list(self.group())
        return None if self._ranks is None else list(self._ranks)

    def is_global(self) -> bool:
        return self._ranks is None and self.mpi_comm is None

    def group(self) -> Tuple[int, ...]:
        """The sorted world ranks of the set (checked against the world size).

        Raises ValueError once ranks have died (fault-tolerant mode) since the set was first
        used: its ranks are those of the old world, which the survivors renumbered."""
        rt = _runtime.current()
        if not self.is_global():
            if self._generation is None:
                self._generation = rt.generation
            elif self._generation != rt.generation:
                failed = list(rt.last_failure.failed) if rt.last_failure is not None else None
                change = (f"rank(s) {failed} died" if failed else "a recovery" if
                          failed is not None else "rank(s) died")
                ranks = list(self._ranks) if self._ranks is not None else "of a communicator"
                raise ValueError(
                    f"process set {self.process_set_id} (ranks {ranks}) was made for the "
                    f"world before {change} "
                    f"(on rank {rt.rank}); its ranks are that world's, and the survivors have "
                    "new ranks. remove_process_set() it and add the set again with ranks of "
                    "the current world (an hvd.on_reset callback is the place)")
        if self.mpi_comm is not None and self._ranks is None:
            self._ranks = _world_ranks_of(self.mpi_comm, rt)
        if self._ranks is None:
            return rt.world_group
        if self._ranks[-1] >= rt.size:
            raise ValueError(f"process set {list(self._ranks)} has ranks beyond the world size "
                             f"{rt.size} (on rank {rt.rank}); use ranks 0..{rt.size - 1}")
        return self._ranks

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
        if self.is_global():
            return "ProcessSet(global)"
        return f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks})"


def _world_ranks_of(comm: MPI.Comm, rt) -> Tuple[int, ...]:
    """World ranks of ``comm``'s members, computed locally by group translation; ranks that
    are not in ripples' world give an error."""
    group = comm.Get_group()
    world = rt.world.Get_group()
    try:
        ranks = MPI.Group.Translate_ranks(group, list(range(group.Get_size())), world)
    finally:
        group.Free()
        world.Free()
    if any(r == MPI.UNDEFINED for r in ranks):
        raise ValueError("ProcessSet(comm): the communicator has members outside ripples' world")
    return tuple(sorted(ranks))


global_process_set = ProcessSet(None)
global_process_set.process_set_id = 0

_registered: Dict[int, ProcessSet] = {0: global_process_set}
_ids = itertools.count(1)


def add_process_set(ranks) -> ProcessSet:
    """Register a process set of ``ranks`` (a ``ProcessSet``, a list of world ranks or an
    mpi4py communicator) and return it with its ``process_set_id``. Local: no collective.

    Raises ValueError, as Horovod does, when a set of the same ranks is already registered
    (adding that same ``ProcessSet`` object again just returns it)."""
    process_set = ranks if isinstance(ranks, ProcessSet) else ProcessSet(ranks)
    if process_set.is_global():
        return global_process_set
    process_set.group()  # validates against the world size
    for known in _registered.values():
        if known is not process_set and known.ranks == process_set.ranks:
            raise ValueError(f"add_process_set: a process set of ranks {process_set.ranks} is "
                             f"already registered (process_set_id {known.process_set_id}"
                             f"{': hvd.global_process_set' if known.is_global() else ''}); "
                             "use that one, or remove_process_set() it first")
    if process_set.process_set_id is None:
        process_set.process_set_id = next(_ids)
        _registered[process_set.process_set_id] = process_set
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Forget a registered set and free its communicator on this rank; False for the global
    set (which is never removed) or a set that is not registered."""
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"remove_process_set takes a ProcessSet, got {type(process_set).__name__}")
    if process_set.is_global():
        return False
    if process_set._ranks is not None and _runtime.is_initialized():
        _runtime.current().engine.discard_group(process_set._ranks)
    known = _registered.pop(process_set.process_set_id, None) if process_set.process_set_id else None
    process_set.process_set_id = None
    return known is not None


def process_sets() -> List[ProcessSet]:
    """The registered process sets, by id (the global set first)."""
    return [_registered[i] for i in sorted(_registered)]


def process_set_by_id(process_set_id: int) -> ProcessSet:
    if process_set_id not in _registered:
        raise ValueError(f"no process set has id {process_set_id}")
    return _registered[process_set_id]
