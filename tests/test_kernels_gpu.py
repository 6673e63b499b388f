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


def test_launches_wrap_each_devices_stream_once_even_where_handles_are_equal(monkeypatch):
    """No GPU needed (stand-ins for cupy and torch's streams): the default stream of every
    device has handle 0, so the cached cupy stream must be per device, and the cache stays
    bounded when a script makes new streams as it goes."""
    from ripples.kernels import cuda

    made, launched = [], []

    class Stream:
        def __init__(self, handle, device):
            self.handle, self.device = handle, device
            made.append(self)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

    class Device(Stream):
        def __init__(self, index):
            self.index = index

    fake_cupy = type("cupy", (), {"cuda": type("cuda", (), {"ExternalStream": Stream,
                                                             "Device": Device})})
    handles = {0: 0, 1: 0}
    monkeypatch.setattr(cuda, "_import_cupy", lambda: fake_cupy)
    monkeypatch.setattr(cuda, "_kernels", {})
    monkeypatch.setattr(cuda, "_streams", {})
    monkeypatch.setattr(cuda, "load_module", lambda index: type("Module", (), {
        "get_function": lambda self, name: lambda grid, block, args: launched.append(
            (index, name))})())
    monkeypatch.setattr(cuda, "current_stream_handle", lambda index: handles[index])
    for _ in range(3):
        for index in (0, 1):
            cuda._launch(index, "k", (1,), ())
    assert [(s.handle, s.device) for s in made] == [(0, 0), (0, 1)]
    assert launched == [(0, "k"), (1, "k")] * 3
    for handle in range(1, 200):  # new streams on device 0, one after another
        handles[0] = handle
        cuda._launch(0, "k", (1,), ())
    assert len(cuda._streams) <= cuda._MAX_STREAMS
