"""Shared pieces of the parameter-server MPI scripts (run as plain scripts, not pytest:
server ranks exit inside ``ripples.ps.start``). A failed check prints and exits 1, which
makes Open MPI end the whole job."""
import sys
import traceback

import torch
from mpi4py import MPI

from ripples import runtime
from ripples.core.config import Config
from ripples.ps import start
from ripples.startup import init


def begin(servers: int, timeout_s: float = 20.0):
    """Enter PS mode; only workers return. Returns (context, worker index, worker count)."""
    context = start(MPI.COMM_WORLD, Config.load(ps_servers=servers, timeout_s=timeout_s))
    return context, context.worker, context.num_workers


def restart_workers_runtime(context, **settings) -> None:
    """Replace the workers' runtime (``ripples.ops``, which CASP communities all-reduce with)
    by one with ``Config(**settings)`` on ``context``'s workers; the servers go on serving.
    The new runtime is not in PS mode: ``DistributedOptimizer(sync="ps")`` no longer works."""
    runtime.shutdown()
    init(comm=context.worker_comm, config=Config(**settings))


def check(ok: bool, what: str) -> None:
    if not ok:
        print(f"CHECK FAILED on world rank {MPI.COMM_WORLD.Get_rank()}: {what}", flush=True)
        sys.stdout.flush()
        MPI.COMM_WORLD.Abort(1)


def run(main) -> None:
    """Run ``main`` and abort the job on any exception, printing it."""
    try:
        main()
    except BaseException as exc:  # noqa: BLE001 - report every failure, then end the job
        if isinstance(exc, SystemExit) and not exc.code:
            raise
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        MPI.COMM_WORLD.Abort(1)


def small_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3))


class ExplodingSGD(torch.optim.SGD):
    """An optimizer whose step fails (on the server, which runs it)."""

    def step(self, closure=None):
        raise RuntimeError("optimizer step exploded")
