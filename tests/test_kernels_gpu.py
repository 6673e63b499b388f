"""The compiled CUDA kernels against the torch reference (GPU tests), and the clear error
when the CUDA path is asked for where it cannot run (runs everywhere)."""
import pytest
import torch

from gpu_support import require_gpu
from ripples import kernels
from ripples.kernels import cuda

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
LENGTHS = [1, 3, 8, 9, 1031, 70001]


def test_cuda_path_without_cupy_or_gpu_raises_runtime_error():
    if cuda.available():
        pytest.skip("cupy and a GPU are present")
    with pytest.raises(RuntimeError) as info:
        cuda.load_module(0)
    assert "cupy" in str(info.value) or "CUDA device" in str(info.value)
    if "cupy" in str(info.value):
        assert isinstance(info.value.__cause__, ImportError)


def _inputs(dtype, device, misalign):
    gen = torch.Generator().manual_seed(7)
    tensors = []
    for i, n in enumerate(LENGTHS):
        base = torch.randn(n + misalign, generator=gen, dtype=torch.float64).mul(3).to(dtype)
        t = base.to(device)[misalign:] if i % 2 else base[misalign:].to(device)
        tensors.append(t)
    tensors.append(torch.randn(6, 5, generator=gen).to(dtype).to(device).t())  # strided
    return tensors


def _assert_match(got, want):
    got, want = got.cpu(), want.cpu()
    if got.dtype in (torch.float16, torch.bfloat16):
        diff = (got.view(torch.int16).int() - want.view(torch.int16).int()).abs()
        assert int(diff.max()) <= 1
    else:
        assert torch.equal(got, want)


@pytest.mark.gpu
@pytest.mark.parametrize("tensor_dtype", DTYPES)
@pytest.mark.parametrize("buffer_dtype", DTYPES)
@pytest.mark.parametrize("misalign", [0, 1])
def test_pack_unpack_on_gpu_match_reference(tensor_dtype, buffer_dtype, misalign):
    require_gpu()
    device = torch.device("cuda")
    tensors = _inputs(tensor_dtype, device, misalign)
    total = sum(t.numel() for t in tensors)
    for scale in (1.0, 0.1):
        out = torch.full((total + 2 + misalign,), -1.0, dtype=buffer_dtype, device=device)
        kernels.pack(tensors, out[misalign:], scale)
        want = torch.full((total + 2,), -1.0, dtype=buffer_dtype)
        kernels.pack([t.cpu() for t in tensors], want, scale)
        torch.cuda.synchronize()
        _assert_match(out[misalign:], want)

        targets = [torch.zeros_like(t) for t in tensors]
        targets[-1] = torch.zeros(6, 5, dtype=tensor_dtype, device=device).t()  # strided
        kernels.unpack(out[misalign:], targets, scale)
        cpu_targets = [torch.zeros(t.shape, dtype=tensor_dtype) for t in tensors]
        kernels.unpack(want, cpu_targets, scale)
        torch.cuda.synchronize()
        for got, w in zip(targets, cpu_targets):
            _assert_match(got, w)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_scale_on_gpu_matches_reference(dtype):
    require_gpu()
    for n in LENGTHS:
        for misalign in (0, 1, 3):
            host = torch.randn(n + misalign, dtype=torch.float64).mul(100).to(dtype)
            dev = host.cuda()
            kernels.scale_(dev[misalign:], 1 / 3)
            kernels.scale_(host[misalign:], 1 / 3)
            torch.cuda.synchronize()
            _assert_match(dev, host)


@pytest.mark.gpu
def test_kernels_run_on_torch_current_stream():
    require_gpu()
    stream = torch.cuda.Stream()
    x = torch.arange(1 << 20, dtype=torch.float32, device="cuda")
    out = torch.empty_like(x)
    with torch.cuda.stream(stream):
        stream.wait_stream(torch.cuda.default_stream())
        kernels.pack([x], out, 2.0)
        kernels.scale_(out, 0.5)
    stream.synchronize()
    assert torch.equal(out.cpu(), torch.arange(1 << 20, dtype=torch.float32))
