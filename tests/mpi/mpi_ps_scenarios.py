"""Parameter-server scenarios, several in one MPI job, one after another (a rank's start
costs seconds of CPU: Python, torch and torch's compiler stack).

Usage: mpi_ps_scenarios.py NAME [NAME...]   (scenarios in the order given)

The scenarios of ``BEFORE_PS`` run first, on the whole world. The job then enters PS mode as
``hvd.init()`` does, from ``RIPPLES_PS_SERVERS``: the servers serve inside it and exit;
the workers run the other scenarios on that one PS context, each building PSOptimizers
(sessions) of its own. The last rank of a scenario's communicator announces it
("scenario NAME: begins"), and, once every rank has finished it, that it passed
("scenario NAME: passed"), so that a test can tell its own scenario's result from another's
(tests/ps_jobs.py). A failed check or an exception ends the whole job (``run``).
"""
import sys

from mpi4py import MPI

import mpi_ps_bsp
import mpi_ps_casp
import mpi_ps_casp_learned
import mpi_ps_epsp
import mpi_ps_failures
import mpi_ps_frontend_policies
import mpi_ps_policies
import mpi_ps_training_patterns
import ps_frontend
from mpi_ps_common import check, run
from ripples.startup import init

BEFORE_PS = {**mpi_ps_failures.BEFORE_PS, **ps_frontend.BEFORE_PS}
IN_PS = {**mpi_ps_bsp.SCENARIOS, **mpi_ps_casp.SCENARIOS, **mpi_ps_casp_learned.SCENARIOS,
         **mpi_ps_epsp.SCENARIOS, **mpi_ps_failures.SCENARIOS,
         **mpi_ps_frontend_policies.SCENARIOS, **mpi_ps_policies.SCENARIOS,
         **mpi_ps_training_patterns.SCENARIOS, **ps_frontend.SCENARIOS}


SCENARIOS = {**BEFORE_PS, **IN_PS}


def announce(comm, text: str) -> None:
    if comm.Get_rank() == comm.Get_size() - 1:
        print(text, flush=True)


def main(names):
    unknown = [name for name in names if name not in SCENARIOS]
    check(not unknown, f"unknown scenarios {unknown}; known: {sorted(SCENARIOS)}")
    in_ps = [name in IN_PS for name in names]
    check(in_ps == sorted(in_ps), f"the scenarios of {sorted(BEFORE_PS)} run on the whole "
                                  f"world, before PS mode: name them first ({names})")
    context = None
    for name in names:
        if name in BEFORE_PS:
            comm, args = MPI.COMM_WORLD, ()
        else:
            context = context or init().ps  # servers serve and exit in here
            comm, args = context.worker_comm, (context,)
        # The barriers keep the announcements in step with what every rank does: no rank
        # starts (and may fail) a scenario before it was announced, nor before the one
        # before was announced as passed.
        announce(comm, f"scenario {name}: begins")
        comm.Barrier()
        SCENARIOS[name](*args)
        comm.Barrier()
        announce(comm, f"scenario {name}: passed")


run(lambda: main(sys.argv[1:]))
