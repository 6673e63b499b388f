"""``DistributedOptimizer`` on a CUDA model, in every data-parallel mode: the same training
on the GPU and on the host must give the same parameters (within float tolerance), and
P-Reduce must keep the sum of the replicas. Runs on any number of GPUs: ranks may share
one (the launching test picks ``RIPPLES_GPU_PATH``)."""
import pytest
import torch

import ripples.torch as hvd
from gpu_models import batch, make_model

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.cuda.set_device(R % torch.cuda.device_count())
GPU = torch.device("cuda", torch.cuda.current_device())
CPU = torch.device("cpu")
STEPS = 5


def train(device: torch.device, sync: str, **kwargs):
    """STEPS steps of SGD with momentum; returns the parameters on the host and, per step,
    the replicas' sums of parameters and of what the local steps alone would give."""
    model = make_model(seed=R, device=device)  # different replicas: averaging shows
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters(), sync=sync,
                                   **kwargs)
    sums = []
    for step in range(STEPS):
        x, y = batch(step, R, device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        local = [(p - 0.1 * p.grad).detach() for p in model.parameters()]
        opt.step()
        if sync != "allreduce":
            sums.append((hvd.grouped_allreduce([p.detach() for p in model.parameters()],
                                               op=hvd.Sum),
                         hvd.grouped_allreduce(local, op=hvd.Sum)))
    if sync != "allreduce":
        opt.close()
    return [p.detach().to(CPU) for p in model.parameters()], sums


@pytest.mark.parametrize("sync,options", [
    ("allreduce", {}),
    ("ripples", {"schedule": "static", "group_size": 2}),
    ("ripples", {"schedule": "random", "group_size": 2}),
    ("adpsgd-sync", {}),
])
def test_a_cuda_model_trains_as_the_same_model_on_the_host(sync, options):
    on_gpu, gpu_sums = train(GPU, sync, **options)
    on_cpu, _ = train(CPU, sync, **options)
    for name, (g, c) in zip(("w1", "b1", "w2", "b2"), zip(on_gpu, on_cpu)):
        assert torch.allclose(g, c, rtol=1e-5, atol=1e-6), \
            f"{sync} {options}: {name} differs by {(g - c).abs().max().item()}"
    for got, expected in gpu_sums:
        for s, e in zip(got, expected):
            assert s.is_cuda and torch.allclose(s, e, atol=1e-5)


def test_generator_mode_on_cuda_keeps_the_sum_of_the_replicas():
    """The generator's groups depend on timing: only what holds for any group is checked."""
    _, sums = train(GPU, "ripples", schedule="generator", group_size=2)
    assert len(sums) == STEPS
    for got, expected in sums:
        for s, e in zip(got, expected):
            assert torch.allclose(s, e, atol=1e-5)


def test_asynchronous_adpsgd_on_cuda_trains_finite_replicas():
    params, _ = train(GPU, "adpsgd")
    assert all(torch.isfinite(p).all() for p in params)


def test_amp_with_a_grad_scaler_keeps_the_replicas_equal():
    """The usual AMP loop: autocast, GradScaler around the wrapped optimizer (Horovod's
    pattern: synchronize, unscale, then step without a second synchronization)."""
    model = make_model(seed=0, device=GPU)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1),
                                   named_parameters=model.named_parameters())
    scaler = torch.amp.GradScaler("cuda")
    for step in range(STEPS):
        x, y = batch(step, R, GPU)
        opt.zero_grad()
        with torch.autocast("cuda", dtype=torch.float16):
            loss = torch.nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        opt.synchronize()
        scaler.unscale_(opt)
        with opt.skip_synchronize():
            scaler.step(opt)
        scaler.update()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    assert torch.isfinite(flat).all()
    everyone = hvd.allgather(flat.unsqueeze(0))
    assert torch.equal(everyone.cpu(), flat.cpu().expand(N, -1))
