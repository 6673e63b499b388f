"""A group member that is stuck versus one that is slow (run by tests/test_liveness.py).

Usage: stuck_peer.py MODE SECONDS. Rank 2 P-Reduces with rank 3 (group (2, 3)); ranks 0 and 1
wait in a barrier of the script's own. MODE ``barrier``: rank 3 waits in that barrier too,
which rank 2 never reaches (a deadlock outside ripples): rank 2's wait must fail naming
rank 3 and where it is. MODE ``computing``: rank 3 computes for SECONDS (a small model's
forward and backward passes, as a long evaluation or a slow step does) before it P-Reduces:
rank 2 must wait for it, however long. MODE ``looping``: the same in a tight loop that calls
no Python function (``sum`` over a generator), which hands over the interpreter lock at the
same instruction every time (``ripples.comm.stack_watch``).
"""
import sys
import time

import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples.core.errors import RipplesTimeoutError

mode, seconds = sys.argv[1], float(sys.argv[2])
hvd.init()
comm = MPI.COMM_WORLD.Dup()
rank = hvd.rank()
start = time.monotonic()
if rank == 2:
    try:
        result = hvd.partial_allreduce(torch.full((4,), 2.0), group=(2, 3), name="pair")
        print(f"rank 2 P-Reduced {result.tolist()} after {time.monotonic() - start:.1f} s",
              flush=True)
    except RipplesTimeoutError as error:
        print(f"rank 2 FAILED after {time.monotonic() - start:.1f} s: {error}", flush=True)
        raise  # ends the job: the others are in a barrier rank 2 never reaches
    comm.Barrier()
elif rank == 3 and mode in ("computing", "looping"):
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    total = 0.0
    while time.monotonic() - start < seconds:
        if mode == "computing":
            model(torch.randn(32, 64)).sum().backward()
        else:
            total += sum(i * 0.5 for i in range(1000))
    hvd.partial_allreduce(torch.full((4,), 4.0), group=(2, 3), name="pair")
    comm.Barrier()
else:
    comm.Barrier()
print(f"rank {rank} DONE", flush=True)
