"""The initialized state of ripples on one rank: one object, created by ``init()``.

It owns the world communicator and its private duplicates and the rank facts, and holds the
group communicator cache, the communication engine (pending collectives) and the fusion
buffers, which ``ripples.startup`` builds from the layers above and attaches.
"""
from __future__ import annotations

import atexit
import logging
import os
import threading
import weakref
from collections import Counter
from typing import Callable, List, Optional, Sequence, Tuple

from mpi4py import MPI

from ripples.comm import fail_fast, failures, membership
from ripples.comm.groups import CommunicatorCache, Group
from ripples.comm.data_watch import DataPhaseWatch
from ripples.comm.liveness import Liveness
from ripples.core.config import Config
from ripples.core.errors import NotInitializedError, PeersSilentError, RanksFailedError
from ripples.observe.timeline import NullTimeline, Timeline, make_timeline

log = logging.getLogger("ripples")

_current: Optional["Runtime"] = None


def hosts_node_by_node(node_of: Sequence[int]) -> bool:
    """Whether ranks whose nodes are ``node_of`` (each named by its lowest rank) sit on
    several hosts with the same number (> 1) of ranks each, numbered host by host as mpiexec
    places them by default: the layout the node-aware schedules assume."""
    per_node = Counter(node_of)
    counts = set(per_node.values())
    if len(per_node) < 2 or len(counts) != 1:
        return False
    local_size = counts.pop()
    return local_size > 1 and all(node == r - r % local_size for r, node in enumerate(node_of))


class Runtime:
    """Everything ``init()`` set up. Access it through ``current()``."""

    def __init__(self, comm: MPI.Comm, config: Config, ps=None):
        """The communicators and rank facts of ``comm`` (collective over it).

        ``ps``: the worker's parameter-server context, or None outside PS mode. The engine,
        fusion buffers and NCCL cache are attached by ``ripples.startup.init``.
        """
        self.config = config
        self.ps = ps
        # Counts the worlds this runtime has had: 0 at init, +1 per recovery from dead ranks.
        # Whatever was planned for a world (buckets, schedules) checks it to plan afresh.
        self.generation = 0
        self._closers: List[Callable[[], None]] = []
        # Called by join() before the ranks meet: decentralized and PS optimizers finish
        # the work already assigned to this rank.
        self.join_hooks: List[Callable[[], None]] = []
        # Called by join() once every rank has joined: an asynchronous AD-PSGD passive rank
        # waits there for its active ranks' last exchanges, answered meanwhile by its
        # responder, so that it serves the active ranks' last collectives (a metric
        # all-reduced every batch) instead of waiting for them outside the join.
        self.joined_hooks: List[Callable[[], None]] = []
        # Called between join()'s rounds while this rank waits for the others to join; may
        # raise (that passive rank's active ranks neither exchanged nor ended in time).
        self.join_poll_hooks: List[Callable[[], None]] = []
        # Called when this rank leaves the training step (a collective of the script, the
        # end of its share of an epoch): schedules that form groups from the ranks that ask
        # stop waiting for it (``Schedule.away``). Cheap and never blocking.
        self.away_hooks: List[Callable[[], None]] = []
        # Called with the group before this rank submits a collective of the script (not a
        # training step's): parameter-server communities bring their members to the same
        # step first (``ps.community``), so the call may block while members catch up.
        self.script_collective_hooks: List[Callable[[tuple], None]] = []
        # The DistributedOptimizers under which ranks may take different numbers of steps
        # (a generator schedule, asynchronous AD-PSGD): a shared DistributedSampler then
        # shares its epochs by speed.
        self.uneven_steps = weakref.WeakSet()
        # The shared samplers' work pool (``ripples.torch.sampler.WorkPool``), made by the
        # first shared DistributedSampler.
        self.work_pool = None
        # Planned all-reduces (ops.bucket_reducer) a joined rank keeps taking part in.
        self.reducers = weakref.WeakSet()
        # Called by recover() on a rank that learns of a death, before the survivors meet:
        # each stops, without talking, what it runs on communicators of its own (revoking
        # them, so that every rank waiting there learns of the death too).
        self.abandon_hooks: List[Callable[[], None]] = []
        # Called by recover() on every survivor, in this order, once the smaller world is
        # up: what was built for the old world (a schedule) is built again (collectives).
        self.rebuild_hooks: List[Callable[[], None]] = []
        # Set by the composition root: attaches the engine and caches to a fresh world.
        self.attach: Callable[["Runtime"], None] = lambda runtime: None
        self._recovery_lock = threading.Lock()
        self.last_failure: Optional[RanksFailedError] = None
        # Ranks the survivors went on without (``recover``), described: every one, and the
        # silent ones (which may still run).
        self.lost: List[str] = []
        self.left_behind: List[str] = []
        self._connect(comm)
        self.timeline = make_timeline(config.timeline, self.rank)
        if config.verbose:
            log.warning("ripples rank %d/%d (local %d/%d, node %d/%d), MPI: %s", self.rank,
                        self.size, self.local_rank, self.local_size, self.cross_rank,
                        self.cross_size, mpi_library())

    def _connect(self, comm: MPI.Comm) -> None:
        """Make ``comm`` this runtime's world: private duplicates and the rank facts."""
        # Private duplicates: user traffic on the caller's communicator never matches ours.
        self.world = comm.Dup()
        self.ctl = comm.Dup()
        self.service_comm = comm.Dup()
        # Groups' ring all-reduces (Config.group_allreduce), point to point.
        self.peers = comm.Dup()
        # Answers peers asking whether this rank is alive, whatever the main thread does.
        self.liveness = Liveness(comm.Dup(), self.config.timeout_s,
                                 self.config.stall_warning_s, self.config.wait_for_busy_peers,
                                 self.config.stall_shutdown_s)
        self.rank = self.world.Get_rank()
        self.size = self.world.Get_size()
        # Bounds the blocking MPI call of a collective once its members agreed.
        self.data_watch = DataPhaseWatch(self.rank, self.config.timeout_s,
                                         self.config.stall_warning_s, self.liveness.probe,
                                         self.config.fault_tolerant,
                                         enabled=self.liveness.answering,
                                         name_hosts=self.liveness.on_hosts,
                                         revoke=self.revoke_world)
        self.local = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        self.local_rank = self.local.Get_rank()
        self.local_size = self.local.Get_size()
        self.cross = self.world.Split(color=self.local_rank, key=self.rank)
        self.cross_rank = self.cross.Get_rank()
        self.cross_size = self.cross.Get_size()
        self.homogeneous = len(set(self.world.allgather(self.local_size))) == 1
        # Each world rank's node, named by its lowest world rank (local rank 0: ``local`` is
        # ordered by world rank): where a group's all-reduce crosses the network
        # (``ring_carries``).
        self.node_of: Tuple[int, ...] = tuple(self.world.allgather(
            self.local.bcast(self.rank, root=0)))
        self.world_group: Group = tuple(range(self.size))
        # Attached by the composition root: the group communicator cache, the NCCL
        # communicators, the fusion buffers and the engine that runs the collectives.
        self.cache: Optional[CommunicatorCache] = None
        self.nccl = None
        self.buffers = None
        self.engine = None

    @property
    def hosts_node_by_node(self) -> bool:
        """Whether the ranks sit on several hosts, equally many (> 1) on each, numbered
        host by host (``hosts_node_by_node``)."""
        return hosts_node_by_node(self.node_of)

    def ring_carries(self, group, nbytes: int) -> bool:
        """Whether ``group``'s host all-reduce of one run of ``nbytes`` goes around a ring of
        point-to-point messages instead of MPI's all-reduce (``Config.ring_carries``; the
        run is across hosts when the members sit on more than one node)."""
        across = len({self.node_of[r] for r in group}) > 1
        return self.config.ring_carries(nbytes, across, world=tuple(group) == self.world_group)

    def left_training_step(self) -> None:
        """This rank is about to do something other than training steps: run the
        ``away_hooks``."""
        for hook in self.away_hooks:
            hook()

    def before_script_collective(self, group: tuple) -> None:
        """This rank is about to submit a collective of the script on ``group``: run the
        ``script_collective_hooks``."""
        for hook in self.script_collective_hooks:
            hook(group)

    def at_shutdown(self, closer: Callable[[], None]) -> None:
        """Run ``closer`` at ``shutdown()``, before communicators are released (last in, first
        run)."""
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

    # ------------------------------------------------------------------ dead ranks

    def raised(self, error: BaseException, generation: Optional[int] = None) -> BaseException:
        """What to raise for ``error``: in fault-tolerant mode a process failure (a dead
        peer, or a communicator revoked after one) or peers that do not answer
        (``PeersSilentError``: frozen, or cut off) becomes ``RanksFailedError`` once the
        survivors have moved onto a smaller world (``recover``); anything else is itself.

        ``generation``: the world the failed operation started in; a failure of an earlier
        world was recovered from already, and gets that recovery's error again.
        """
        if isinstance(error, RanksFailedError):  # recovered from already
            return error
        if not (self.config.fault_tolerant and _recoverable_failure(error)):
            return error
        if generation is not None and generation < self.generation:
            return self.last_failure
        return self.recover(error)

    def recover(self, error: BaseException) -> RanksFailedError:
        """Survive dead or silent ranks: revoke every communicator of this world (so that the
        other survivors stop waiting in them too), agree who goes on
        (``ripples.comm.membership``: a side without a majority stops there), make the
        world of those, and rebuild the
        world, control, service and liveness communicators, the group cache and the engine
        on the smaller world. Collective over the survivors; returns the error to raise.

        Pending collectives fail with the returned error. Whatever was planned for the old
        world (gradient buckets, schedules) sees ``generation`` change and plans again.
        """
        with self._recovery_lock:
            self.revoke_world()
            for abandon in list(self.abandon_hooks):
                abandon()
            old_rank, old_size = self.rank, self.size
            if self.engine is not None:
                self.engine.abandon(error)
            for reducer in list(self.reducers):
                reducer.abandon(error)
            self.reducers = weakref.WeakSet()
            self.data_watch.close()
            if self.nccl is not None:
                self.nccl.close()
            # Who goes on: the ranks that reach each other, if a majority (else this exits).
            decision = membership.agree(self.liveness, self.generation, self.liveness.on_hosts)
            leaving = sorted(decision.silent + decision.dead)
            bound_s = 3 * self.config.timeout_s + 10
            with fail_fast.bounded(bound_s, lambda: (
                    f"rank {self.rank} could not make the world of the survivors of rank(s) "
                    f"{leaving} within {bound_s:g} s ({error}); Open MPI's communicator "
                    "creation waits for a silent rank after one that failed for it (a rank "
                    "lost while its group made a communicator): the job is ended")):
                survivors, failed, how = self._survivors(decision)
                if failed:
                    self.lost.append(f"rank(s) {failed} of the {old_size}-rank world"
                                     f"{self.liveness.on_hosts(failed)}")
                self.liveness.abandon()  # after the round: the others' probes needed it
                self._connect(survivors)
            survivors.Free()
            self.attach(self)
            self.generation += 1
            for rebuild in list(self.rebuild_hooks):
                rebuild()
            if failed:
                found = (f"rank(s) {failed} of the {old_size}-rank world {how} ({error}); the "
                         f"{self.size} survivors go on: this rank was {old_rank}, now "
                         f"{self.rank}")
            else:  # e.g. a network cut that healed between the timeout and the round
                found = (f"no rank of the {old_size}-rank world was lost ({error}): every "
                         "rank answered the membership round (a network cut that healed, or "
                         f"a rank slow to answer); all {self.size} go on in a new world: "
                         f"this rank is {self.rank}")
            failure = RanksFailedError(found, failed=failed, size=self.size, rank=self.rank,
                                       generation=self.generation)
            self.last_failure = failure
            log.warning("%s", failure)
        for callback in list(_reset_callbacks):
            callback()
        return failure

    def _survivors(self, decision: membership.Decision):
        """The members of ``decision`` as a communicator, with the ranks left out and how
        they failed (collective over the members)."""
        if not decision.silent:
            survivors, failed = failures.shrink(self.world)
            return survivors, failed, "died"
        survivors = membership.new_world(self.liveness.comm, decision)  # a shrink would wait
        how = (f"did not answer (frozen, hung or cut off: rank(s) {decision.silent}"
               f"{self.liveness.on_hosts(decision.silent)})")
        self._left_behind(decision)
        return survivors, sorted(decision.silent + decision.dead), how

    def revoke_world(self) -> None:
        """Revoke every communicator of this world but the liveness one (fault tolerant):
        each rank waiting in one, now or later, fails out of it and recovers. Safe from any
        thread."""
        comms = [self.world, self.ctl, self.service_comm, self.peers, self.local, self.cross]
        if self.cache is not None:
            comms += self.cache.comms()
        comms += [reducer.comm for reducer in list(self.reducers)]
        if self.engine is not None:
            comms += self.engine.lanes.comms()
        failures.revoke(comms)

    def _left_behind(self, decision: membership.Decision) -> None:
        """The survivors went on without ``decision.silent`` ranks that may still be
        running: ``MPI_Finalize`` would wait for them, so this process ends without it. The
        first member tells the launcher which ranks of the launch those are."""
        silent = decision.silent
        if not self.left_behind:
            atexit.register(_exit_without_finalizing, self)
        self.left_behind.append(f"rank(s) {silent} of the {self.size}-rank world"
                                f"{self.liveness.on_hosts(silent)}")
        if decision.members and decision.members[0] == self.rank:
            launch = MPI.Group.Translate_ranks(self.world.Get_group(), silent,
                                               MPI.COMM_WORLD.Get_group())
            fail_fast.say(f"{failures.LEFT_BEHIND} {sorted(launch)}"
                          f"{self.liveness.on_hosts(silent)}")

    def close(self) -> None:
        """Stop the engine, run the ``at_shutdown`` closers, write the timeline, release
        the communicators."""
        if self.engine is not None:
            self.engine.close()
        if self.lost:  # no survivor exits while another still needs its messages
            try:
                self.world.Barrier()
            except MPI.Exception as exc:
                # Another survivor failed as it shut down: they did not all finish.
                log.warning("ripples: rank %d: not every survivor shut down (%s)", self.rank,
                            exc)
            else:
                if self.rank == 0:  # every survivor got here: the job's result is theirs
                    fail_fast.say(f"{failures.FINISHED_WITHOUT} {'; '.join(self.lost)}" + (
                        ", which may still run: the launcher ends them" if self.left_behind
                        else ""))
        while self._closers:
            self._closers.pop()()
        self.stop_timeline()
        if self.nccl is not None:
            self.nccl.close()
        if self.cache is not None:
            self.cache.close()
        self.data_watch.close()
        self.liveness.close()
        for comm in (self.cross, self.local, self.peers, self.service_comm, self.ctl,
                     self.world):
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


# Called after every recovery from dead ranks, in registration order (``on_reset``).
_reset_callbacks: List[Callable[[], None]] = []


def on_reset(callback: Callable[[], None]) -> None:
    """Call ``callback()`` after each recovery from dead ranks (fault-tolerant mode), once
    the survivors are on the smaller world: ``size()`` and ``rank()`` are the new ones."""
    if not callable(callback):
        raise TypeError(f"on_reset(callback=...) takes a callable, got {callback!r}")
    _reset_callbacks.append(callback)


def _exit_without_finalizing(runtime: Runtime) -> None:
    """At interpreter exit, after ``runtime`` left silent ranks behind: shut down (``close``
    meets the other survivors and tells the launcher), and end the process without
    ``MPI_Finalize``, which would wait for the silent ranks."""
    status = 0
    try:
        if _current is runtime:
            shutdown()
    except Exception as exc:  # noqa: BLE001 - exiting either way; say why it is not clean
        fail_fast.say(f"rank {runtime.rank} could not shut down cleanly: {exc}")
        status = 1
    fail_fast.flush_streams()
    os._exit(status)


def _recoverable_failure(error: BaseException) -> bool:
    """Whether ``error``, or an error it was raised from, is an MPI process failure, or
    names peers that did not answer a liveness check (fault tolerant: both are recovered
    from)."""
    seen = set()
    while error is not None and id(error) not in seen:
        if failures.is_process_failure(error) or isinstance(error, PeersSilentError):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False
