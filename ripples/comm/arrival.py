"""Everyone arrives at ``init()``, or the job ends: the one wait before liveness exists.

``init()`` runs collectives (communicator splits and duplicates) that block until every
rank calls them. A rank that died or froze before its ``init()`` would leave the others
there for good, and no liveness responder runs yet to ask it. So the ranks first meet in
a non-blocking barrier polled against a bound: ranks start at different times (imports, a
dataset loaded before ``init()``), hence a generous bound, never below
``MIN_ARRIVAL_S``; past it the job is ended with a message saying so.
"""
from __future__ import annotations

import time

from mpi4py import MPI

from ripples.comm import fail_fast

MIN_ARRIVAL_S = 60.0


def arrival_bound_s(stall_shutdown_s: float) -> float:
    """How long ``init()`` waits for every rank to arrive: ``stall_shutdown_s``, at least
    ``MIN_ARRIVAL_S`` (0, no stall bound: unbounded)."""
    return max(stall_shutdown_s, MIN_ARRIVAL_S) if stall_shutdown_s else float("inf")


def wait_for_everyone(comm: MPI.Comm, bound_s: float) -> None:
    """Return once every rank of ``comm`` called this; past ``bound_s`` seconds print why
    and end the job (``MPI_Abort``)."""
    if comm.Get_size() == 1:
        return
    request = comm.Ibarrier()
    start = time.monotonic()
    pause = 1e-4
    while not request.Test():
        waited = time.monotonic() - start
        if waited > bound_s:
            fail_fast.end_job(
                f"rank {comm.Get_rank()} waited {waited:.0f} s in init() for the other ranks "
                "to call init() too: some rank died, froze or never calls it "
                f"(Config.stall_shutdown_s bounds this wait, at least {MIN_ARRIVAL_S:g} s); "
                "ending the job")
        time.sleep(pause)
        pause = min(0.01, pause * 2)
