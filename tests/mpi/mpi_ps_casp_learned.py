"""communities="learned" through DistributedOptimizer(sync="ps") (1 server + 4 workers, two
of them about 6x slower): server 0's learned controller re-forms the communities, never
mixing a fast worker with a slow one, and training completes. (How many communities the
fast pair makes depends on the timings measured on a shared machine.)

Scenario ``casp learned`` (run by mpi_ps_scenarios.py)."""
import time

import torch

import ripples.torch as hvd


def learned(context):
    hvd.init()  # the job entered PS mode through it: this returns the same runtime
    worker = hvd.rank()
    assert hvd.size() == context.num_workers == 4, (hvd.size(), context.num_workers)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 2)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sync="ps",
                                   policy="casp", communities="learned", regroup_every=3)
    gen = torch.Generator().manual_seed(worker)
    for step in range(40):
        time.sleep(0.03 if worker >= 2 else 0.005)
        x = torch.randn(16, 8, generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), (x[:, 0] > 0).long()).backward()
        opt.step()
    hvd.join()
    communities = opt.metrics()["communities"]
    assert len(communities) >= 2 and [2, 3] in communities, communities
    assert all(torch.isfinite(p).all() for p in model.parameters())
    print(f"worker {worker} learned communities {communities}", flush=True)


SCENARIOS = {"casp learned": learned}
