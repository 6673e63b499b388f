"""A member freezes after the members agreed on a collective, before its data phase (run by
tests/test_fail_fast_mpi.py): the others sit in a blocking MPI all-reduce it never joins.

Rank 1 replaces its engine's data step with one that stops its own process (SIGSTOP) first.
The job must end (MPI_Abort) with a message naming rank 1, not hang.
"""
import os
import signal
import time

import torch

import ripples.torch as hvd
from ripples import runtime

hvd.init()
hvd.allreduce(torch.ones(1), name="warm-up")
if hvd.rank() == 1:
    engine = runtime.current().engine

    def freeze(*args):
        print(f"FREEZING at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)

    engine._reduce_fused = freeze
hvd.allreduce(torch.ones(1000), name="gradients")
print(f"rank {hvd.rank()} FINISHED", flush=True)
