"""Dead ranks under ULFM (Open MPI's User-Level Failure Mitigation): telling a process
failure from other MPI errors, revoking communicators, and shrinking the world.

With ``mpiexec --with-ft ulfm`` an MPI call that cannot complete because a peer died
returns ``ERR_PROC_FAILED`` (or ``ERR_PROC_FAILED_PENDING`` for a wildcard receive)
instead of blocking, and a revoked communicator fails every pending and later call with
``ERR_REVOKED``. Failures are not reported uniformly (a collective may succeed on some
ranks and fail on others), so the first rank that sees one revokes every communicator it
shares with the others; then every survivor fails out of whatever it waits in, and all
of them meet in ``shrink``.

Failure notification, measured with Open MPI 5.0.11 on one node (4 ranks, one killed):
- over ``tcp`` the survivors see the failure at once (the dead rank's sockets close);
- over shared memory (``sm``, the default between ranks of a node) nothing reports it
  and the survivors wait for good, unless Open MPI's heartbeat detector is on
  (``mpi_ft_detector``), which names the failure after its timeout;
- that detector must run in its own thread (``mpi_ft_detector_thread``): without it a
  rank busy outside MPI for longer than the timeout misses its heartbeats, is declared
  dead and aborts itself;
- with the threaded detector, 2 of 8 and 1 of 7 four-rank jobs that import torch
  crashed (SIGSEGV) inside ``MPI_Init``; over ``tcp`` with no detector, 0 of 10.
So ``MPIEXEC_ARGS`` (``ripplesrun --fault-tolerant``) run over ``tcp,self``: a crash is
seen at once. A rank that hangs without dying is not a process failure to MPI: ripples'
liveness check names it in a ``RipplesTimeoutError`` instead (no recovery).

They also set ``async_mpi_finalize``: after a death, 1 of 3 four-rank jobs hung at exit,
every survivor inside ``MPI_Finalize`` waiting for the job-wide PMIx fence that the dead
rank never joins (gdb: ``ompi_mpi_finalize`` polling in ``usleep``). With ULFM on,
``MPI_Finalize`` first shrinks the world and runs a barrier among the survivors, which
flushes their messages; the fence after it is what the setting skips.

mpi4py is imported inside the functions: the launcher reads ``MPIEXEC_ARGS`` without
initializing MPI.
"""
from __future__ import annotations

import functools
import os
from typing import Iterable, List, Tuple

MPIEXEC_ARGS = ("--with-ft", "ulfm", "--mca", "btl", "tcp,self", "--mca", "async_mpi_finalize",
                "1")

# Printed by the survivors' rank 0 at exit when they went on without silent ranks (frozen,
# or on a host cut off), which mpiexec waits for: the launcher then ends the job.
FINISHED_WITHOUT = "the survivors finished without"
# What a fault-tolerant rank says as it leaves the job with an uncaught error, and what the
# survivors say of the silent ranks they leave behind, in ranks of ``MPI.COMM_WORLD`` (the
# launch's numbering): ``ripplesrun`` ends a job in which every rank did one or the other,
# since mpiexec would wait for the silent ones for good.
LEFT_AS_DEAD = "leaves the job as a dead rank"
LAUNCH_RANK = "launch rank"
LEFT_BEHIND = "left behind, silent: launch rank(s)"



@functools.lru_cache(maxsize=None)
def _failure_classes() -> frozenset:
    from mpi4py import MPI
    return frozenset(getattr(MPI, name) for name in
                     ("ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED")
                     if hasattr(MPI, name))


def ulfm_active(environ=None) -> bool:
    """Whether this process was started with Open MPI's fault tolerance on (``--with-ft ulfm``
    sets ``OMPI_MCA_mpi_ft_enable``) by an MPI library that has ``Comm.Shrink``."""
    from mpi4py import MPI
    environ = os.environ if environ is None else environ
    enabled = environ.get("OMPI_MCA_mpi_ft_enable", "").lower() in ("1", "true", "yes")
    return enabled and hasattr(MPI.Comm, "Shrink") and bool(_failure_classes())


def missing_launch_settings(environ=None) -> List[str]:
    """The ``--mca`` settings of ``MPIEXEC_ARGS`` this process was not started with, as
    ``"name value"`` texts (empty when all are there)."""
    environ = os.environ if environ is None else environ
    settings = zip(MPIEXEC_ARGS, MPIEXEC_ARGS[1:], MPIEXEC_ARGS[2:])
    wanted = [(name, value) for flag, name, value in settings if flag == "--mca"]
    return [f"--mca {name} {value}" for name, value in wanted
            if environ.get(f"OMPI_MCA_{name}") != value]


def is_process_failure(error: BaseException) -> bool:
    """Whether ``error`` is an MPI error raised because a peer died or a communicator was
    revoked after a death."""
    from mpi4py import MPI
    return isinstance(error, MPI.Exception) and error.Get_error_class() in _failure_classes()


def revoke(comms: Iterable) -> None:
    """Revoke each communicator (already revoked or freed ones are skipped): every rank
    waiting in it, now or later, fails with ``ERR_REVOKED`` instead of waiting."""
    from mpi4py import MPI
    for comm in comms:
        if comm is None or comm == MPI.COMM_NULL:
            continue
        try:
            comm.Revoke()
        except MPI.Exception:
            pass


def shrink(comm) -> Tuple[object, List[int]]:
    """The survivors of ``comm`` as a new communicator, and the ranks of ``comm`` that died.

    Collective over the survivors (fault tolerant: it absorbs failures while it runs).
    The survivors keep their order: rank ``r`` of the new communicator is the ``r``-th
    survivor.
    """
    from mpi4py import MPI
    survivors = comm.Shrink()
    old_ranks = MPI.Group.Translate_ranks(survivors.Get_group(), list(range(survivors.Get_size())),
                                          comm.Get_group())
    failed = sorted(set(range(comm.Get_size())) - set(old_ranks))
    return survivors, failed


def acknowledge(comm) -> List[int]:
    """Acknowledge every death ``comm`` has noticed; return the ranks of ``comm`` known dead.

    Until acknowledged, a death fails every wildcard receive and probe on ``comm``
    (``ERR_PROC_FAILED_PENDING``), even one that a live rank's message would match.
    """
    from mpi4py import MPI
    comm.Ack_failed()
    failed = comm.Get_failed()
    try:
        return sorted(MPI.Group.Translate_ranks(failed, list(range(failed.Get_size())),
                                                comm.Get_group()))
    finally:
        failed.Free()


class DeathWatch:
    """The ranks of one communicator known dead, learnt from the errors MPI raises."""

    def __init__(self, comm):
        self.comm = comm
        self.known: set = set()

    def absorb(self, error: BaseException) -> List[int]:
        """The ranks newly known dead, if ``error`` is a process failure (acknowledged, so
        that wildcard receives on the communicator work again); any other error is raised."""
        if not is_process_failure(error):
            raise error
        now = set(acknowledge(self.comm))
        new = sorted(now - self.known)
        self.known |= now
        return new

