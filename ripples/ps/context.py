"""Splitting the job into parameter servers and workers (``start``)."""
from __future__ import annotations

import atexit
import sys
import time

from mpi4py import MPI

from ..comm import fail_fast
from ..core.errors import RipplesError
from . import slowness
from .transport import Channel


class PSContext:
    """What a worker needs to talk to the servers.

    ``worker_comm``: the workers only (ranks 0..W-1), the runtime's world in PS mode.
    ``ps_comm``: a private duplicate of the world; servers are its ranks 0..S-1 and worker
    ``w`` is rank ``S + w``. ``channel`` carries the requests and answers. The last
    ``spare`` of the ``num_servers`` servers start idle (elastic scaling, see ``psld``).
    """

    def __init__(self, ps_comm, worker_comm, num_servers: int, timeout_s: float, spare: int = 0):
        self.ps_comm = ps_comm
        self.worker_comm = worker_comm
        self.num_servers = num_servers
        self.spare = spare
        self.num_workers = ps_comm.Get_size() - num_servers
        self.worker = ps_comm.Get_rank() - num_servers
        self.timeout_s = timeout_s
        self.channel = Channel(ps_comm, num_servers)
        self.channel.timeout_s = timeout_s
        self._sessions = 0
        self._closed = False

    def new_session_id(self) -> int:
        """Ids for PSOptimizers; every worker creates them in the same order."""
        self._sessions += 1
        return self._sessions

    def shutdown(self) -> None:
        """Tell every server this worker is done (servers exit when all workers are) and
        wait for each one's answer, ``timeout_s`` at most (a heartbeat extends it).

        Raises RipplesError naming a server that does not answer: one frozen or stuck
        would otherwise keep the job from ending after every worker has left. Idempotent;
        also run at interpreter exit (``shutdown_at_exit``) so that servers never wait for
        a finished script.
        """
        if self._closed:
            return
        self._closed = True
        asked = [(server, self.channel.send(server, {"kind": "bye", "w": self.worker}))
                 for server in range(self.num_servers)]
        self.channel.outbox.flush(time.monotonic() + self.timeout_s, "PS shutdown")
        for server, rid in asked:
            self.channel.wait(server, rid, self.timeout_s,
                              f"worker {self.worker} saying goodbye (PS shutdown)")

    def shutdown_at_exit(self) -> None:
        """``shutdown`` at interpreter exit, where an exception would only be printed and the
        job would wait for good on the server that did not answer: end the job instead."""
        try:
            self.shutdown()
        except RipplesError as error:
            fail_fast.end_job(f"{error}; the job is ended (MPI_Abort) so that it does not "
                              "wait for that server")


def make_context(world_comm, num_servers: int, timeout_s: float, spare: int = 0) -> PSContext:
    """Create the PS communicators (collective over ``world_comm``, same order everywhere).

    ``num_servers`` counts the spares too. Returns a context on every rank;
    ``context.worker < 0`` on servers, whose ``worker_comm`` is ``MPI.COMM_NULL``.
    """
    size = world_comm.Get_size()
    if not isinstance(spare, int) or not 0 <= spare < num_servers:
        raise ValueError(f"spare parameter servers must be an integer in [0, {num_servers - 1}] "
                         f"(fewer than the {num_servers} servers, so that one starts active), "
                         f"got {spare!r}; set RIPPLES_PS_SPARE or --ps-spare accordingly")
    if not isinstance(num_servers, int) or not 0 < num_servers < size:
        raise ValueError(f"ps_servers must be an integer in [1, {size - 1}] for a job of "
                         f"{size} ranks (at least one rank must be a worker), got {num_servers!r}")
    rank = world_comm.Get_rank()
    ps_comm = world_comm.Dup()
    color = 0 if rank >= num_servers else MPI.UNDEFINED
    worker_comm = world_comm.Split(color, key=rank)
    return PSContext(ps_comm, worker_comm, num_servers, timeout_s, spare)


def start(world_comm, config, spare=None) -> PSContext:
    """Enter parameter-server mode with ``config.ps_servers`` active servers and ``spare``
    idle ones (default ``config.ps_spare``), which PSLD can scale out onto.

    On the first ``config.ps_servers + spare`` ranks this serves until every worker has shut
    down, then finalizes MPI and exits the process with status 0 (the rest of the script
    does not run there). On the other ranks it returns the worker's ``PSContext``.
    """
    from .server import serve

    if spare is None:
        spare = config.ps_spare
    context = make_context(world_comm, config.ps_servers + spare, config.timeout_s, spare)
    if context.worker < 0:
        serve(context.ps_comm, context.num_servers, config.timeout_s,
              {slowness.SLOWDOWN_ENV: config.server_slowdown,
               slowness.COST_ENV: config.server_cost})
        context.ps_comm.Free()
        sys.stdout.flush()
        if not MPI.Is_finalized():
            MPI.Finalize()
        sys.exit(0)
    atexit.register(context.shutdown_at_exit)
    return context
