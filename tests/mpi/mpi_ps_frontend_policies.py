"""CASP and EPSP through DistributedOptimizer(sync="ps") (1 server + 3 workers): arguments
reach the servers, bad values raise on every worker naming the argument, and a CASP run on
the digits set learns.

Scenario ``frontend policies`` (run by mpi_ps_scenarios.py)."""
import time

import torch

import ripples.torch as hvd


def bad(expect, **kwargs):
    model = torch.nn.Linear(2, 1)
    try:
        hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                 named_parameters=model.named_parameters(), sync="ps", **kwargs)
    except ValueError as exc:
        assert expect in str(exc), (expect, str(exc))
        return
    raise AssertionError(f"{kwargs} must raise on worker {hvd.rank()}")


def frontend_policies(context):
    from sklearn.datasets import load_digits

    hvd.init()  # the job entered PS mode through it: this returns the same runtime
    worker = hvd.rank()
    assert hvd.size() == context.num_workers == 3, (hvd.size(), context.num_workers)
    bad("communities", policy="casp", communities=0)
    bad("communities", policy="casp", communities="learnt")
    bad("regroup_every", policy="casp", regroup_every=-1)
    bad("staleness", policy="epsp", staleness=-1)
    bad("tasks_per_clock", policy="epsp", tasks_per_clock=2)
    bad("policy must be one of", policy="nope")
    bad("communities applies only", policy="epsp", communities=2)

    digits = load_digits()
    x = torch.tensor(digits.data / 16.0, dtype=torch.float32)
    y = torch.tensor(digits.target)
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.5),
                                   named_parameters=model.named_parameters(), sync="ps",
                                   policy="casp", communities="projected", regroup_every=3)
    gen = torch.Generator().manual_seed(worker)
    for step in range(60):
        time.sleep(0.03 if worker == 2 else 0.005)
        idx = torch.randint(0, len(y), (32,), generator=gen)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x[idx]), y[idx]).backward()
        opt.step()
    hvd.join()
    metrics = opt.metrics()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
    assert accuracy > 0.85, accuracy
    # Worker 2 is 6x slower: no projection groups it with a fast worker. Whether workers 0
    # and 1 share a community depends on how alike their measured times are, which a loaded
    # machine can change (seen: [[0], [1], [2]] under a full test run).
    communities = metrics["communities"]
    assert [2] in communities and sorted(sum(communities, [])) == [0, 1, 2], communities
    print(f"worker {worker} ok accuracy {accuracy:.3f} communities {metrics['communities']}",
          flush=True)


SCENARIOS = {"frontend policies": frontend_policies}
