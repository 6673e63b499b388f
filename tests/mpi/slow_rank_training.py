"""One rank trains SLOWDOWN times slower than the others and finishes long after them
(run by tests/test_liveness.py; ``RIPPLES_TIMEOUT_S`` sets the timeout).

Usage: slow_rank_training.py SYNC STEPS FAST_STEP_S. Every rank runs STEPS steps; the last
rank's steps take SLOWDOWN times FAST_STEP_S (a sleep standing for compute). The fast ranks
then wait in ``join()`` (all-reduce) or in the schedule's end (decentralized) for it. Prints
``DONE rank R after S s`` on success; any error ends the process with its message.
"""
import sys
import time

import torch

import ripples.torch as hvd

SLOWDOWN = 10
sync, steps, fast_step_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
hvd.init()
torch.manual_seed(0)
model = torch.nn.Linear(8, 2)
kwargs = {} if sync == "allreduce" else {"schedule": "generator", "group_size": 2}
opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                               named_parameters=model.named_parameters(), sync=sync, **kwargs)
hvd.broadcast_parameters(model.state_dict(), root_rank=0)
slow = hvd.rank() == hvd.size() - 1
start = time.monotonic()
for step in range(steps if sync != "allreduce" or slow else steps // SLOWDOWN):
    opt.zero_grad()
    model(torch.ones(4, 8)).sum().backward()
    time.sleep(fast_step_s * (SLOWDOWN if slow else 1))
    opt.step()
hvd.join()
if hasattr(opt, "close"):
    opt.close()
print(f"DONE rank {hvd.rank()} after {time.monotonic() - start:.1f} s", flush=True)
hvd.shutdown()
