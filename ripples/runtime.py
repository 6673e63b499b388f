"""The initialized state of ripples on one rank: one object, created by ``init()``.

It owns the world communicator and its private duplicates, the rank facts, the group
communicator cache, the queue of pending asynchronous collectives and the fusion buffers.
"""
from __future__ import annotations

import atexit
import logging
from typing import Callable, List, Optional, Tuple

from mpi4py import MPI

from ripples.comm.control import agree
from ripples.comm.groups import CommunicatorCache, Group
from ripples.config import Config
from ripples.errors import NotInitializedError
from ripples.timeline import make_timeline

log = logging.getLogger("ripples")

_current: Optional["Runtime"] = None


class Runtime:
    """Everything ``init()`` set up. Access it through ``current()``."""

    def __init__(self, comm: Optional[MPI.Comm], config: Config):
        from ripples.ops.fusion import FusionQueue
        from ripples.ops.gpu import NcclCache

        if not MPI.Is_initialized():
            MPI.Init_thread(MPI.THREAD_MULTIPLE)
        self.config = config
        base = MPI.COMM_WORLD if comm is None else comm
        self.ps = None
        if config.ps_servers:
            from ripples import ps
            self.ps = ps.start(base, config)  # server ranks serve and exit inside
            base = self.ps.worker_comm
        # Private duplicates: user traffic on the caller's communicator never matches ours.
        self.world = base.Dup()
        self.ctl = base.Dup()
        self.service_comm = base.Dup()
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.local = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        self.cross = self.world.Split(color=self.local_rank, key=self.rank)
        self.cross_rank = self.cross.Get_rank()
        self.cross_size = self.cross.Get_size()
        self.world_group: Group = tuple(range(self.size))
        self.nccl = NcclCache()
        self.cache = CommunicatorCache(self.world, config.cache_capacity,
                                       on_free=self.nccl.drop)
        self.queue = FusionQueue(self)
        self.timeline = make_timeline(config.timeline, self.rank)
        self._closers: List[Callable[[], None]] = []
        # Called by join() before the ranks meet: decentralized and PS optimizers finish
        # the work already assigned to this rank.
        self.join_hooks: List[Callable[[], None]] = []
        if config.verbose:
            log.warning("ripples rank %d/%d (local %d/%d, node %d/%d), MPI: %s", self.rank,
                        self.size, self.local_rank, self.local_size, self.cross_rank,
                        self.cross_size, mpi_library())

    def communicator(self, group: Group, what: str, signature: str,
                     wire: str = "") -> Tuple[MPI.Comm, int]:
        """The communicator of ``group`` once its members agreed on ``what``/``signature``,
        and the number of members contributing data (fewer than the group after ``join()``).

        Runs the control exchange (bounded by ``Config.timeout_s``) and builds the
        communicator when any member lacks it.
        """
        comm = self.world if group == self.world_group else self.cache.lookup(group)
        if len(group) == 1:  # a group of one communicates with nobody: no communicator
            return comm, 1
        start = self.timeline.now() if self.timeline.enabled else 0.0
        decision = agree(self.ctl, group, what, signature, comm is None,
                         self.config.timeout_s, self.config.stall_warning_s, wire)
        if self.timeline.enabled:  # the control round trip is where a rank waits for peers
            self.timeline.complete("wait", "wait", start, self.timeline.now() - start,
                                   {"group": list(group), "for": what})
        if decision.create:
            comm = self.cache.create(group)
        return comm, decision.active

    def at_shutdown(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` at ``shutdown()``, before communicators are released (last in, first run)."""
        self._closers.append(closer)

    def close(self) -> None:
        self.queue.flush()
        while self._closers:
            self._closers.pop()()
        self.timeline.close()
        self.nccl.close()
        self.cache.close()
        for comm in (self.cross, self.local, self.service_comm, self.ctl, self.world):
            comm.Free()


def current() -> Runtime:
    """The runtime of this process; raises ``NotInitializedError`` before ``init()``."""
    if _current is None:
        raise NotInitializedError("ripples is not initialized: call ripples.torch.init() "
                                  "(hvd.init()) before using any collective")
    return _current


def is_initialized() -> bool:
    return _current is not None


def init(comm: Optional[MPI.Comm] = None, config: Optional[Config] = None, **settings) -> Runtime:
    """Create the runtime (idempotent: a second call returns the existing one)."""
    global _current
    if _current is None:
        if comm is not None and not isinstance(comm, MPI.Comm):
            raise TypeError(f"init(comm=...) takes an mpi4py communicator, got {type(comm).__name__}")
        _current = Runtime(comm, config or Config.load(**settings))
        atexit.register(shutdown)  # runs before mpi4py finalizes MPI (registered earlier)
    return _current


def shutdown() -> None:
    """Release every communicator; a later ``init()`` starts afresh."""
    global _current
    if _current is not None:
        runtime, _current = _current, None
        runtime.close()


def mpi_library() -> str:
    """First line of the MPI library's version string (which MPI is in use)."""
    return MPI.Get_library_version().rstrip("\0").splitlines()[0].strip()
