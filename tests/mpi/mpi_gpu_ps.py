"""Parameter-server mode with a CUDA model (1 server + 2 workers, ``RIPPLES_PS_SERVERS=1``):
under BSP five steps give the parameters of the same training of a host model (relative
1e-5), and ASP and CASP train finite CUDA replicas. Ranks may share one GPU (the launching
test picks ``RIPPLES_GPU_PATH=host`` for CASP's P-Reduce).

Run as a script under mpiexec; each worker prints ``GPU_PS worker=W ok`` at the end."""
import torch

import ripples.torch as hvd
from gpu_models import batch, make_model

hvd.init()  # the server returns never: it serves inside init() and exits
W = hvd.rank()
assert hvd.size() == 2, f"expected 2 workers, got {hvd.size()}"
torch.cuda.set_device(0)
GPU, CPU = torch.device("cuda", 0), torch.device("cpu")
STEPS = 5


def train(device: torch.device, policy: str, **kwargs):
    """STEPS steps of SGD with momentum through the servers; the parameters on the host."""
    model = make_model(0, device)
    opt = hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                                   named_parameters=model.named_parameters(), sync="ps",
                                   policy=policy, **kwargs)
    for step in range(STEPS):
        x, y = batch(step, W, device)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    opt.join()
    for p in model.parameters():
        assert p.device == device, f"{policy}: a parameter moved to {p.device}"
    return [p.detach().to(CPU) for p in model.parameters()]


on_gpu, on_cpu = train(GPU, "bsp"), train(CPU, "bsp")
for name, g, c in zip(("w1", "b1", "w2", "b2"), on_gpu, on_cpu):
    assert torch.allclose(g, c, rtol=1e-5, atol=1e-6), \
        f"bsp worker {W}: {name} differs by {(g - c).abs().max().item()}"
for policy, options in (("asp", {}), ("casp", {"communities": 1})):
    params = train(GPU, policy, **options)
    assert all(torch.isfinite(p).all() for p in params), f"{policy}: non-finite parameters"
print(f"GPU_PS worker={W} ok", flush=True)
