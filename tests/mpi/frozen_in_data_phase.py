"""A member freezes after the members agreed on a collective, inside a blocking MPI call the
others then wait in for good (run by tests/test_fail_fast_mpi.py).

Usage: frozen_in_data_phase.py [PLACE]. Rank 1 replaces the step at PLACE with one that
stops its own process (SIGSTOP) first:
- ``data`` (default): the data phase of an agreed all-reduce ('gradients');
- ``communicator``: making the communicator of a new group (0, 1), after its members agreed;
- ``arming``: arming the native lane of the world (Dup and an all-reduce), after the
  world's second eligible all-reduce;
- ``join``: the all-reduce that ends ``join()``, once every rank has joined;
- ``buckets``: a gradient bucket's all-reduce (``DistributedOptimizer``, all-reduce mode),
  on the bucket thread, after the members agreed on the step.
The job must end (MPI_Abort) with a message naming rank 1, not hang; rank 1 never takes
part in the frozen step, even when the launcher's teardown resumes it.
"""
import os
import signal
import sys
import time

import torch

import ripples.torch as hvd
from ripples import runtime

place = sys.argv[1] if len(sys.argv) > 1 else "data"
hvd.init()
hvd.allreduce(torch.ones(1), name="warm-up")
if hvd.rank() == 1:
    rt = runtime.current()

    def freeze(*args, **kwargs):
        """Replaces the step at PLACE: stops this process for good."""
        print(f"FREEZING at {time.time():.3f}", flush=True)
        os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(1)  # sent from a thread, the stop may land a moment later
        # Only the launcher's teardown resumes it (SIGCONT before SIGTERM): frozen for
        # good, it must not take part after all, or a waiting member could complete.
        os._exit(3)

    if place == "data":
        rt.engine._reduce_fused = freeze
    elif place == "communicator":
        rt.cache.create = freeze
    elif place == "arming":
        rt.engine.lanes._arm = freeze
    elif place == "buckets":
        from ripples.ops.bucket_reducer import BucketReducer
        BucketReducer._allreduce = freeze
    elif place == "join":
        class FreezingAllreduce:
            """The control communicator, its ``allreduce`` (the end of join) frozen."""

            def __init__(self, comm):
                self.allreduce = self.Allreduce = freeze
                self._comm = comm

            def __getattr__(self, name):
                return getattr(self._comm, name)

        rt.ctl = FreezingAllreduce(rt.ctl)
if place == "communicator":
    if hvd.rank() < 2:
        hvd.partial_allreduce(torch.ones(10), group=(0, 1), name="pair")
elif place == "arming":
    for _ in range(3):
        hvd.allreduce(torch.ones(1000), name="gradients")
elif place == "join":
    hvd.join()
elif place == "buckets":
    model = torch.nn.Linear(10, 10)
    optimizer = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                         named_parameters=model.named_parameters())
    model(torch.ones(4, 10)).sum().backward()
    optimizer.step()
else:
    hvd.allreduce(torch.ones(1000), name="gradients")
print(f"rank {hvd.rank()} FINISHED", flush=True)
