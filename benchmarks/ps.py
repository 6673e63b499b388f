"""Parameter-server policies: eager (decoupled) pull against coupled push-then-pull, and
ASP / SSP / eager against BSP with one slow worker; with ``--scenarios``, every policy on
heterogeneous workers, training to a target accuracy.

This file reads the command line, launches itself under ``mpiexec`` with the ranks the mode
needs (or runs in the job it is started in) and runs the mode, one module each under
``benchmarks/ps/`` (their docstrings say what each measures):

    python benchmarks/ps.py --json benchmarks/results/ps.json
        1 server + 4 workers (``mpiexec -n 5``), ``ps/policies.py``
    python benchmarks/ps.py --scenarios --json benchmarks/results/ps_heterogeneous.json
        1 server + 8 workers (``mpiexec -n 9``), ``ps/scenarios.py``
    python benchmarks/ps.py --transport --json benchmarks/results/ps_transport.json
        a server and a worker (``mpiexec -n 2``), ``ps/transport.py``
    python benchmarks/ps.py --psld --json benchmarks/results/ps_psld.json
        2 servers + 1 spare + 4 workers (``mpiexec -n 7``), ``ps/psld.py``
    python benchmarks/ps.py --budget --seconds 6 --json benchmarks/results/ps_budget_1.json
    python benchmarks/ps.py --sweep --seconds 3 --json benchmarks/results/ps_sweep.json
        1 server + 8 workers (``mpiexec -n 9``), digits MLP on a wall-clock budget,
        ``ps/budget.py``
    python benchmarks/ps.py --sim-sweep --json benchmarks/results/ps_sim_sweep.json
        the same policies in the simulator, 32 and 256 workers, ``ps/sim_sweep.py``

Compute is emulated (sleep) in every mode; ``--scenarios`` also trains a real softmax
regression on the bundled digits set.
"""
from __future__ import annotations

import importlib
import sys

from harness import launch
from ps.options import RANKS, job_env, mode, parse


def main(argv=None) -> int:
    args = parse(__doc__.splitlines()[0], argv)
    name = mode(args)
    if name not in RANKS:  # the simulator runs in this process
        importlib.import_module(f"ps.{name}").main(args)
        return 0
    if not launch.under_mpi():
        return launch.relaunch(RANKS[name], job_env(name, args))
    importlib.import_module(f"ps.{name}").main(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
