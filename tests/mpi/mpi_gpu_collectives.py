"""Collectives and P-Reduce on CUDA tensors through ripples' NCCL path (one GPU per rank)."""
import torch

import ripples.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
torch.cuda.set_device(R % torch.cuda.device_count())
DEVICE = torch.device("cuda", torch.cuda.current_device())


def test_allreduce_and_partial_on_cuda_match_the_host_results():
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        x = torch.full((1000,), float(R + 1), dtype=dtype, device=DEVICE)
        got = hvd.allreduce(x, op=hvd.Sum)
        assert got.is_cuda and torch.equal(got.cpu(), torch.full((1000,), float(sum(range(1, N + 1))), dtype=dtype))
        y = torch.full((7, 3), float(R), dtype=dtype, device=DEVICE)
        hvd.partial_allreduce_(y, range(N))
        assert torch.equal(y.cpu(), torch.full((7, 3), (N - 1) / 2, dtype=dtype))


def test_fused_async_on_cuda():
    xs = [torch.full((i + 1,), float(R), device=DEVICE) for i in range(5)]
    handles = [hvd.allreduce_async_(x, op=hvd.Sum) for x in xs]
    for h in handles:
        hvd.synchronize(h)
    torch.cuda.synchronize()
    assert all(torch.equal(x.cpu(), torch.full_like(x.cpu(), float(sum(range(N))))) for x in xs)
