"""The initialized state of ripples on one rank: one object, created by ``init()``.

It owns the world communicator and its private duplicates and the rank facts, and holds the
group communicator cache, the communication engine (pending collectives) and the fusion
buffers, which ``ripples.startup`` builds from the layers above and attaches.
"""
from __future__ import annotations

import atexit
import logging
import os
import weakref
from typing import Callable, List, Optional, Tuple

from mpi4py import MPI

from ripples.comm.groups import CommunicatorCache, Group
from ripples.comm.liveness import Liveness
from ripples.config import Config
from ripples.errors import NotInitializedError
from ripples.timeline import NullTimeline, Timeline, make_timeline

log = logging.getLogger("ripples")

_current: Optional["Runtime"] = None


class Runtime:
    """Everything ``init()`` set up. Access it through ``current()``."""

    def __init__(self, comm: MPI.Comm, config: Config, ps=None):
        """The communicators and rank facts of ``comm`` (collective over it).

        ``ps``: the worker's parameter-server context, or None outside PS mode. The engine,
        fusion buffers and NCCL cache are attached by ``ripples.startup.init``.
        """
        self.config = config
        self.ps = ps
        # Private duplicates: user traffic on the caller's communicator never matches ours.
        self.world = comm.Dup()
        self.ctl = comm.Dup()
        self.service_comm = comm.Dup()
        # Answers peers asking whether this rank is alive, whatever the main thread does.
        self.liveness = Liveness(comm.Dup(), config.timeout_s, config.stall_warning_s,
                                 config.wait_for_busy_peers)
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        self.local = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        self.cross = self.world.Split(color=self.local_rank, key=self.rank)
        self.cross_rank = self.cross.Get_rank()
        self.cross_size = self.cross.Get_size()
        self.homogeneous = len(set(self.world.allgather(self.local_size))) == 1
        self.world_group: Group = tuple(range(self.size))
        # Attached by the composition root: the group communicator cache, the NCCL
        # communicators, the fusion buffers and the engine that runs the collectives.
        self.cache: Optional[CommunicatorCache] = None
        self.nccl = None
        self.buffers = None
        self.engine = None
        self.timeline = make_timeline(config.timeline, self.rank)
        self._closers: List[Callable[[], None]] = []
        # Called by join() before the ranks meet: decentralized and PS optimizers finish
        # the work already assigned to this rank.
        self.join_hooks: List[Callable[[], None]] = []
        # Planned all-reduces (ops.bucket_reducer) a joined rank keeps taking part in.
        self.reducers = weakref.WeakSet()
        if config.verbose:
            log.warning("ripples rank %d/%d (local %d/%d, node %d/%d), MPI: %s", self.rank,
                        self.size, self.local_rank, self.local_size, self.cross_rank,
                        self.cross_size, mpi_library())

    def at_shutdown(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` at ``shutdown()``, before communicators are released (last in, first run)."""
        self._closers.append(closer)

    def cancel_at_shutdown(self, closer: Callable[[], None]) -> None:
        """Forget ``closer`` (one registered with ``at_shutdown``, if still there)."""
        if closer in self._closers:
            self._closers.remove(closer)

    # Consecutive timelines are told apart on the wire by this count (equal on every rank,
    # since starting and stopping are collective).
    _timeline_generation = 0

    def start_timeline(self, path, mark_cycles: bool = False) -> None:
        """Record a new timeline, to be written at ``path`` (see ``stop_timeline``).

        Collective over the world: every rank calls it (rank 0's ``path`` names the merged
        trace; each rank's own path is where its file goes if the merge fails). A timeline
        already recording is stopped and written first, as ``stop_timeline()`` does.
        ``mark_cycles``: ``Timeline.mark_cycle()`` (called once per communication cycle)
        records an instant event.
        """
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ValueError(f"start_timeline(file_path=...) takes a file path, got {path!r}")
        self.stop_timeline()
        self.timeline = Timeline(path, self.rank, mark_cycles=mark_cycles)

    def stop_timeline(self) -> None:
        """Stop recording and write the trace: one file at the timeline's path, written by
        rank 0, or per-rank files (``Config.timeline_per_rank``, or when a rank's events do
        not arrive within ``Config.timeout_s``). Collective over the world; without a
        recording timeline it does nothing."""
        if not self.timeline.enabled:
            return
        timeline, self.timeline = self.timeline, NullTimeline(rank=self.rank)
        self._timeline_generation += 1
        timeline.close(self.ctl, self.config.timeout_s, self.config.timeline_per_rank,
                       self._timeline_generation)

    def close(self) -> None:
        """Stop the engine, run the ``at_shutdown`` closers, write the timeline, release
        the communicators."""
        if self.engine is not None:
            self.engine.close()
        while self._closers:
            self._closers.pop()()
        self.stop_timeline()
        if self.nccl is not None:
            self.nccl.close()
        if self.cache is not None:
            self.cache.close()
        self.liveness.close()
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


def install(runtime: Runtime) -> Runtime:
    """Make ``runtime`` the one ``current()`` returns, closed by ``shutdown()`` (at the latest
    at interpreter exit). Called once by ``ripples.startup.init``."""
    global _current
    if _current is not None:
        raise RuntimeError("ripples is already initialized")
    _current = runtime
    atexit.register(shutdown)  # runs before mpi4py finalizes MPI (registered earlier)
    return runtime


def shutdown() -> None:
    """Release every communicator; a later ``init()`` starts afresh."""
    global _current
    if _current is not None:
        runtime, _current = _current, None
        runtime.close()


def mpi_library() -> str:
    """First line of the MPI library's version string (which MPI is in use)."""
    return MPI.Get_library_version().rstrip("\0").splitlines()[0].strip()
