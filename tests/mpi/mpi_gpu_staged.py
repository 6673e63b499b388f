"""Broadcast, all-gather, all-to-all and reduce-scatter of CUDA tensors, which move through
host memory: two ranks may share one GPU (no NCCL involved). Results must equal the host
results and stay on the input's device."""
import torch

import ripples.torch as hvd

hvd.init()
R, N = hvd.rank(), hvd.size()
DEVICE = torch.device("cuda", R % torch.cuda.device_count())


def on_device(t):
    return t.to(DEVICE)


def test_broadcast_in_place_and_into_a_new_tensor():
    for dtype in (torch.float32, torch.bfloat16, torch.int64, torch.bool):
        x = on_device(torch.full((5, 3), R + 1).to(dtype))
        hvd.broadcast_(x, root_rank=N - 1)
        assert x.device == DEVICE and torch.equal(x.cpu(), torch.full((5, 3), N).to(dtype))
        y = on_device(torch.arange(6).reshape(2, 3).t() * (R + 1))  # not contiguous
        got = hvd.broadcast(y, root_rank=0)
        assert got.device == DEVICE and torch.equal(got.cpu(), torch.arange(6).reshape(2, 3).t())


def test_broadcast_parameters_of_a_cuda_model():
    torch.manual_seed(R)
    model = torch.nn.Linear(4, 2).to(DEVICE)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    torch.manual_seed(0)
    reference = torch.nn.Linear(4, 2)
    assert torch.equal(model.weight.cpu(), reference.weight.detach())


def test_allgather_with_different_rows():
    x = on_device(torch.full((R + 1, 2), float(R)))
    got = hvd.allgather(x)
    expected = torch.cat([torch.full((r + 1, 2), float(r)) for r in range(N)])
    assert got.device == DEVICE and torch.equal(got.cpu(), expected)


def test_alltoall_with_splits():
    x = on_device(torch.arange(N * 2, dtype=torch.float32) + 100 * R)
    received, splits = hvd.alltoall(x, splits=[2] * N)
    expected = torch.cat([torch.arange(2 * R, 2 * R + 2, dtype=torch.float32) + 100 * r
                          for r in range(N)])
    assert received.device == DEVICE and torch.equal(received.cpu(), expected)
    assert splits.tolist() == [2] * N


def test_reducescatter_average():
    x = on_device(torch.arange(N * 3, dtype=torch.float32).reshape(N, 3) * (R + 1))
    got = hvd.reducescatter(x, op=hvd.Average)
    mean = sum(r + 1 for r in range(N)) / N
    expected = torch.arange(N * 3, dtype=torch.float32).reshape(N, 3)[R:R + 1] * mean
    assert got.device == DEVICE and torch.allclose(got.cpu(), expected)
