"""Starting ripples on one rank: the composition root above ``runtime``, ``ops`` and ``ps``.

``runtime`` holds the state and the communicator facts; the collectives (``ops``) and the
parameter servers (``ps``) use it. This module puts them together: it starts PS mode when
configured, builds the ``Runtime`` on the worker communicator and attaches the engine, the
fusion buffers and the communicator caches.
"""
from __future__ import annotations

import warnings
from typing import Optional

from mpi4py import MPI

from ripples import runtime as _runtime
from ripples.comm import arrival, fail_fast, failures
from ripples.comm.groups import CommunicatorCache
from ripples.comm.nccl_watchdog import NcclWatchdog
from ripples.core.config import Config
from ripples.ops.collectives import allgather_as_joined, broadcast_as_joined
from ripples.ops.engine import Engine
from ripples.ops.fusion import FusionBuffers
from ripples.ops.gpu import NcclCache
from ripples.ops.reduction import participate_with_identity, reduce_requests


def init(comm: Optional[MPI.Comm] = None, config: Optional[Config] = None,
         **settings) -> _runtime.Runtime:
    """Create this rank's runtime and make it ``runtime.current()`` (collective over ``comm``,
    default the MPI world).

    Idempotent: a second call returns the existing runtime. ``config`` (default
    ``Config.load(**settings)``) with ``ps_servers`` set enters parameter-server mode first:
    server ranks serve and exit inside this call, workers continue on the workers'
    communicator.
    """
    if _runtime.is_initialized():
        return _runtime.current()
    if comm is not None and not isinstance(comm, MPI.Comm):
        raise TypeError(f"init(comm=...) takes an mpi4py communicator, got {type(comm).__name__}")
    config = config or Config.load(**settings)
    config.apply_log_level()
    if config.fault_tolerant:
        check_fault_tolerance(config)
    if not MPI.Is_initialized():
        MPI.Init_thread(MPI.THREAD_MULTIPLE)
    if config.abort_on_exception:
        fail_fast.install(MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size(),
                          config.fault_tolerant)
    base = MPI.COMM_WORLD if comm is None else comm
    arrival.wait_for_everyone(base, arrival.arrival_bound_s(config.stall_shutdown_s))
    ps_context = None
    if config.ps_servers:
        from ripples import ps
        ps_context = ps.start(base, config)  # server ranks serve and exit inside
        base = ps_context.worker_comm
    runtime = _runtime.Runtime(base, config, ps=ps_context)
    check_same_transport(runtime)
    runtime.attach = attach_engine
    attach_engine(runtime)
    return _runtime.install(runtime)


def check_fault_tolerance(config: Config) -> None:
    """Raise ValueError unless ``Config.fault_tolerant`` can work: Open MPI's ULFM must be on."""
    if not failures.ulfm_active():
        raise ValueError("Config.fault_tolerant (RIPPLES_FAULT_TOLERANT=1) needs Open MPI's "
                         "fault tolerance: launch with `ripplesrun --fault-tolerant ...`, or "
                         f"`mpiexec {' '.join(failures.MPIEXEC_ARGS)} ...`")
    missing = failures.missing_launch_settings()
    if missing:
        warnings.warn(f"Config.fault_tolerant: this job was launched without {missing}; a "
                      "death may then go unnoticed or hang the survivors at exit (see "
                      "ripples.comm.failures): launch with `ripplesrun --fault-tolerant` or "
                      f"`mpiexec {' '.join(failures.MPIEXEC_ARGS)} ...`", stacklevel=3)


def check_same_transport(runtime: _runtime.Runtime) -> None:
    """Raise ValueError on every rank unless all ranks move group all-reduces the same way
    (``Config.group_allreduce``): a ring member and a communicator member would wait on
    each other for good. Collective over the world."""
    transport = runtime.config.group_transport
    transports = runtime.ctl.allgather(transport)
    if len(set(transports)) > 1:
        by_transport: dict = {}
        for rank, each in enumerate(transports):
            by_transport.setdefault(each, []).append(rank)
        described = "; ".join(f"rank(s) {ranks} {each!r}" for each, ranks in by_transport.items())
        raise ValueError(
            f"Config.group_allreduce differs between ranks: groups all-reduce by {described} "
            "('by size': the ring from 16 MiB, a communicator below); this is rank "
            f"{runtime.rank}; set RIPPLES_GROUP_ALLREDUCE (and RIPPLES_FAULT_TOLERANT) alike "
            "on every rank")


def attach_engine(runtime: _runtime.Runtime) -> None:
    """Give ``runtime`` what its collectives run on: the NCCL communicator cache, the group
    communicator cache (which drops a group's NCCL communicator with its MPI one), the
    fusion buffers and the engine."""
    runtime.nccl = NcclCache(NcclWatchdog(runtime.config.timeout_s))
    runtime.cache = CommunicatorCache(runtime.world, runtime.config.cache_capacity,
                                      on_free=runtime.nccl.drop)
    runtime.buffers = FusionBuffers()
    runtime.engine = Engine(
        runtime,
        lambda comm, group, active, requests: reduce_requests(runtime, comm, group, active,
                                                              requests),
        {"allreduce": lambda comm, wires: participate_with_identity(comm, wires,
                                                                    runtime.nccl),
         "allgather": allgather_as_joined,
         "broadcast": broadcast_as_joined})
