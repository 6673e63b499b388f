"""One rank raises an uncaught exception mid-training (run by tests/test_fail_fast_mpi.py).

Usage: rank_raises.py SYNC. After a warm-up all-reduce, rank 1 raises ValueError at step 3
and prints the wall-clock time it raised at; the other ranks go on into their next
collectives. With ``Config.abort_on_exception`` (the default) the job ends at once.
"""
import sys
import time

import torch

import ripples.torch as hvd

sync = sys.argv[1]
hvd.init()
hvd.allreduce(torch.ones(1), name="warm-up")
model = torch.nn.Linear(8, 2)
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                               named_parameters=model.named_parameters(), sync=sync)
for step in range(1000):
    if hvd.rank() == 1 and step == 3:
        print(f"RAISING at {time.time():.3f}", flush=True)
        raise ValueError("an error in the training script on rank 1")
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    opt.step()
    hvd.allreduce(torch.ones(1), name="metric")
    time.sleep(0.01)
print(f"rank {hvd.rank()} FINISHED", flush=True)
