"""BSP through 1 or 2 servers equals synchronous data-parallel SGD (gradients averaged with
Allreduce on the workers, optimizer applied locally), step by step.

Scenario ``bsp`` (run by mpi_ps_scenarios.py): one session per placement (with one server
every placement puts everything on it: roundrobin only); with one server, a bfloat16 model
trains, and mismatched models and arguments are then rejected.
"""
import torch
from mpi4py import MPI

from mpi_ps_common import check, small_model
from ripples.core.errors import MismatchError
from ripples.ps.optimizer import PSOptimizer


PLACEMENTS = ("roundrobin", "greedy", "mxnet", "hash")


def bsp(context):
    servers = context.num_servers
    for placement in PLACEMENTS if servers > 1 else PLACEMENTS[:1]:
        bsp_matches_synchronous_sgd(context, servers, placement)
    if servers == 1:
        a_bfloat16_model_trains(context)
        mismatched_models_are_rejected(context, context.worker)


def a_bfloat16_model_trains(context):
    """A dtype numpy lacks: its values reach the servers at the start (worker 0 sends them,
    which failed before) and after each step every worker holds the servers' parameters."""
    model = small_model(seed=0).to(torch.bfloat16)
    start = [p.detach().clone() for p in model.parameters()]
    ps = PSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                     context, policy="bsp", timeout_s=20)
    gen = torch.Generator().manual_seed(200 + context.worker)
    for _ in range(3):
        model.zero_grad()
        x = torch.randn(5, 8, generator=gen).to(torch.bfloat16)
        torch.nn.functional.cross_entropy(model(x).float(), torch.randint(0, 3, (5,),
                                                                          generator=gen)).backward()
        ps.step()
    ps.join()
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    everyone = context.worker_comm.allgather(flat)
    check(all(p.dtype is torch.bfloat16 for p in model.parameters()), "the model stays bfloat16")
    check(all(torch.equal(other, flat) for other in everyone), "workers hold different values")
    check(any(not torch.equal(p, q) for p, q in zip(model.parameters(), start)),
          "three BSP steps left the parameters where they started")


def bsp_matches_synchronous_sgd(context, servers, placement):
    worker, workers = context.worker, context.num_workers
    model = small_model(seed=worker)  # different inits: servers must start from worker 0's
    reference = small_model(seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    boundaries = []
    ps = PSOptimizer(opt, model.named_parameters(), context, policy="bsp",
                     placement=placement, chunk_bytes=96, timeout_s=20,
                     controller=lambda o: boundaries.append(o.clock))
    for p, q in zip(model.parameters(), reference.parameters()):
        check(torch.equal(p, q), "initial pull must give worker 0's parameters")
    ref_opt = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-3)
    comm = context.worker_comm
    gen = torch.Generator().manual_seed(100 + worker)
    for step in range(6):
        x = torch.randn(5, 8, generator=gen)
        y = torch.randint(0, 3, (5,), generator=gen)
        for m in (model, reference):
            m.zero_grad()
            torch.nn.functional.cross_entropy(m(x), y).backward()
        for p in reference.parameters():
            total = p.grad.numpy().copy()
            comm.Allreduce(MPI.IN_PLACE, total, op=MPI.SUM)
            p.grad.copy_(torch.from_numpy(total) / workers)
        ref_opt.step()
        ps.step()
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            check(torch.allclose(p, q, atol=1e-6, rtol=1e-5),
                  f"step {step} {name}: max diff {(p - q).abs().max().item()}")
    check(boundaries == [1, 2, 3, 4, 5, 6], f"controller called after each step: {boundaries}")
    ps.join()
    metrics = ps.metrics()
    check(set(metrics["staleness_hist"]) == {0}, f"BSP staleness {metrics['staleness_hist']}")
    check(all(s["updates"] == 6 for s in metrics["server_load"]), "6 rounds applied per server")
    if worker == 0:
        print(f"bsp servers={servers} placement={placement} OK "
              f"load={[s['bytes_in'] for s in metrics['server_load']]}", flush=True)


def mismatched_models_are_rejected(context, worker):
    model = torch.nn.Linear(4, 3 if worker == 0 else 2)
    try:
        PSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(), context)
        check(False, "different models on different workers must be rejected")
    except MismatchError as exc:
        check("'weight' shape (3, 4)" in str(exc), f"message must name the tensor: {exc}")
    model = torch.nn.Linear(4, 3)
    try:  # a bad argument on one worker: it gets ValueError, the others MismatchError
        PSOptimizer(torch.optim.SGD(model.parameters(), lr=0.1), model.named_parameters(),
                    context, policy="ssp", staleness=1 if worker == 0 else -1)
        check(False, "staleness=-1 on one worker must be rejected everywhere")
    except ValueError as exc:
        check(worker != 0 and "staleness" in str(exc), f"worker {worker}: {exc!r}")
    except MismatchError as exc:
        check(worker == 0 and "staleness" in str(exc), f"worker {worker}: {exc!r}")


SCENARIOS = {"bsp": bsp}
