"""Optimizers as scripts really use them, never closed by hand, then a clean shutdown.

``rebuilt``: a new DistributedOptimizer per phase (as after changing parameter groups),
the last phase with different numbers of steps per rank, then ``join()``. ``two``: two
optimizers at once over two models (a GAN's generator and discriminator), stepped
alternately, the last steps uneven, then ``join()``. Each
rank prints ``rank R DONE`` after ``shutdown()`` returns, and before it how far the
replicas are apart (``SPREAD``), so the launcher can check that they were averaged.
"""
import sys
import threading

import torch

import ripples.torch as hvd
from ripples.runtime import current

hvd.init()
R, N = hvd.rank(), hvd.size()
pattern, sync = sys.argv[1], sys.argv[2]
# The generator with the "all" division and groups of everyone averages every replica at
# every step, as all-reduce keeps them equal: either way the replicas must stay equal.
options = {"sync": sync, "schedule": "generator", "policy": "all",
           "group_size": N} if sync == "ripples" else {}


def model_of(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def wrapped(model):
    return hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                    named_parameters=model.named_parameters(), **options)


def train(model, opt, steps):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(8, 4)).square().mean().backward()
        opt.step()


def spread(models):
    """The largest difference of a parameter between ranks (0 when replicas are equal)."""
    result = 0.0
    for model in models:
        flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        result = max(result, float((hvd.allreduce(flat, op=hvd.Max)
                                    - hvd.allreduce(flat, op=hvd.Min)).abs().max()))
    return result


models = [model_of(R)] if pattern == "rebuilt" else [model_of(R), model_of(100 + R)]
for model in models:  # as every Horovod script starts
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
if pattern == "rebuilt":
    for phase in range(3):
        train(models[0], wrapped(models[0]), 4)
    print(f"rank {R} SPREAD {spread(models):.3g}", flush=True)
    # What the three optimizers built so far hold that is still running: the last one's.
    services = sum(t.name == "ripples-group-generator" for t in threading.enumerate())
    print(f"rank {R} LIVE services {services} reducers {len(current().reducers)}", flush=True)
    train(models[0], wrapped(models[0]), 2 + R)  # uneven: the fast ranks join early
    hvd.join()
else:
    optimizers = [wrapped(m) for m in models]
    for step in range(8 + R):  # uneven after 6 steps: the fast ranks join early
        if step == 6:
            print(f"rank {R} SPREAD {spread(models):.3g}", flush=True)
        for model, opt in zip(models, optimizers):
            train(model, opt, 1)
    hvd.join()
hvd.shutdown()
print(f"rank {R} DONE", flush=True)
