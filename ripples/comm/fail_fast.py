"""Fail fast: an exception that escapes the script on one rank ends the job at once.

Without it, the failing rank's interpreter exits through ``MPI_Finalize``, which waits for
the other ranks, while they wait in their next collective for the failing one: the job ends
only when each survivor's timeout has passed, each printing a traceback of its own. With
it (``Config.abort_on_exception``, on by default), as ``python -m mpi4py`` does, the
failing rank prints its traceback once and calls ``MPI_Abort``: the launcher stops every
rank within moments and the job's exit status is non-zero.

Under ``Config.fault_tolerant`` the failing rank must not take the job down: it leaves the
way a dead rank does (its traceback printed, then ``os._exit`` without finalizing) and the
survivors recover without it.
"""
from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
import traceback
from typing import Callable, Iterator

from mpi4py import MPI

from ripples.comm import failures

EXIT_STATUS = 1
# How long MPI_Abort may take to end this process. It asks the launcher to stop every rank
# and may wait for good for an answer (a launcher busy with a host cut off): the process
# then prints where its threads are and exits on its own.
ABORT_BOUND_S = 20.0
_installed = {"hook": None}
_lock = threading.Lock()


def install(rank: int, size: int, fault_tolerant: bool) -> None:
    """Make an uncaught exception on this rank end the job (idempotent).

    Chains to the ``sys.excepthook`` in place, which prints the traceback first. A
    one-rank job keeps Python's own exit: nobody waits for it.
    """
    with _lock:
        if _installed["hook"] is not None or size <= 1:
            return
        previous = sys.excepthook

        def end_job_on_uncaught(kind, value, tb):
            if previous is sys.__excepthook__:
                # One write: Python's own hook writes the last line in pieces, and the
                # launcher's abort notice could land between them in the job's output.
                _write_once("".join(traceback.format_exception(kind, value, tb)))
            else:
                previous(kind, value, tb)
            leave(rank, kind, fault_tolerant)

        sys.excepthook = end_job_on_uncaught
        _installed["hook"] = end_job_on_uncaught


def leave(rank: int, kind: type, fault_tolerant: bool) -> None:
    """End this process after an uncaught ``kind``: abort the job, or, fault tolerant, die
    alone so that the survivors recover."""
    launch_rank = (MPI.COMM_WORLD.Get_rank() if MPI.Is_initialized() and not MPI.Is_finalized()
                   else rank)
    action = (f"{failures.LEFT_AS_DEAD} ({failures.LAUNCH_RANK} {launch_rank}; "
              "fault tolerant: the others go on)"
              if fault_tolerant else "aborts the job (MPI_Abort) so that no rank waits for it")
    message = (f"rank {rank} raised an uncaught {kind.__name__} and {action}; "
               "RIPPLES_ABORT_ON_EXCEPTION=0 lets it exit normally instead")
    if fault_tolerant:
        say(message)
        os._exit(EXIT_STATUS)
    end_job(message)


def end_job(message: str) -> None:
    """Print ``ripples: message`` and end the whole job (``MPI_Abort``): what every bound
    does that finds a wait which cannot end otherwise."""
    say(message)
    if MPI.Is_initialized() and not MPI.Is_finalized():
        # a C thread of its own: it fires whatever holds the GIL, in whichever thread
        faulthandler.dump_traceback_later(ABORT_BOUND_S, exit=True)
        MPI.COMM_WORLD.Abort(EXIT_STATUS)


@contextlib.contextmanager
def bounded(seconds: float, message: Callable[[], str]) -> Iterator[None]:
    """End the job (``end_job(message())``) if the block is still running after
    ``seconds``: the bound on a step made of MPI calls that no timeout of their own can end."""
    timer = threading.Timer(seconds, lambda: end_job(message()))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def _write_once(text: str) -> None:
    try:
        sys.stderr.write(text)
        sys.stderr.flush()
    except (OSError, ValueError):
        pass


def say(message: str) -> None:
    """Print ``ripples: message`` to standard error and flush both streams (the process may
    end right after, without Python's own flush)."""
    print(f"ripples: {message}", file=sys.stderr)
    flush_streams()


def flush_streams() -> None:
    """Flush standard output and error, whatever state they are in."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
