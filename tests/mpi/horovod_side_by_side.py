"""horovod.torch and ripples.torch in one script on one MPI world (needs Horovod)."""
import torch
from mpi4py import MPI

import horovod.torch as horovod
import ripples.torch as hvd

horovod.init(comm=MPI.COMM_WORLD)
hvd.init(comm=MPI.COMM_WORLD)
assert horovod.rank() == hvd.rank() and horovod.size() == hvd.size()
x = torch.full((4,), float(hvd.rank()))
expected = torch.full((4,), float(sum(range(hvd.size()))))
assert torch.equal(horovod.allreduce(x, op=horovod.Sum), expected)
assert torch.equal(hvd.allreduce(x, op=hvd.Sum), expected)
hvd.shutdown()
horovod.shutdown()
print("side by side ok", flush=True)
