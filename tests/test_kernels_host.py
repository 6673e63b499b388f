"""The kernels' per-element code (csrc/common.cuh), built for the host with the system C++
compiler and run lane by lane as a GPU grid would, against the torch reference.

fp32/fp64 results must match bit for bit, fp16/bf16 within one unit in the last place;
odd lengths, misaligned tensors and misaligned buffer offsets included.
"""
import ctypes
import shutil
import subprocess

import numpy as np
import pytest
import torch

from ripples import kernels
from ripples.kernels.sources import source_dir

# Its module-scoped fixture runs once per test process: keep its tests in one.
pytestmark = pytest.mark.xdist_group("kernels_host")

DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
CODE = {d: i for i, d in enumerate(DTYPES)}
LENGTHS = [0, 1, 3, 7, 8, 9, 16, 33, 250, 1031]


class Segment(ctypes.Structure):
    _fields_ = [("ptr", ctypes.c_uint64), ("numel", ctypes.c_int64), ("offset", ctypes.c_int64)]


@pytest.fixture(scope="module")
def lib(tmp_path_factory):
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler on PATH")
    out = tmp_path_factory.mktemp("host") / "libripples_host.so"
    subprocess.run([cxx, "-O2", "-std=c++14", "-Wall", "-Werror", "-fno-strict-aliasing",
                    "-shared", "-fPIC", f"-I{source_dir()}", str(source_dir() / "host_test.cpp"),
                    "-o", str(out)], check=True, capture_output=True, text=True)
    library = ctypes.CDLL(str(out))
    for name in ("ripples_host_pack", "ripples_host_unpack"):
        getattr(library, name).argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(Segment),
                                           ctypes.c_int, ctypes.c_void_p, ctypes.c_double,
                                           ctypes.c_longlong]
    library.ripples_host_scale.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_longlong,
                                           ctypes.c_double, ctypes.c_longlong]
    return library


class Arena:
    """Byte memory in which tensors are placed at chosen (mis)alignments."""

    def __init__(self, nbytes):
        self.bytes = np.zeros(nbytes + 64, dtype=np.uint8)
        # Start from a 64-byte boundary so requested offsets mean what they say.
        self.base = (-self.bytes.ctypes.data) % 64
        self.cursor = self.base

    def place(self, numel, dtype, misalign_elements):
        size = torch.empty((), dtype=dtype).element_size()
        start = self.cursor + (-self.cursor) % 16 + misalign_elements * size
        self.cursor = start + numel * size
        raw = torch.from_numpy(self.bytes[start:start + numel * size])
        return raw.view(dtype)


def _values(n, dtype, generator):
    """Random values with specials mixed in: zeros, signed infinities, NaN, subnormals and
    values that overflow fp16."""
    v = torch.randn(n, generator=generator, dtype=torch.float64) * 3
    if n > 8:
        v[:8] = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"),
                              1e-7, -3e-6, 7e4], dtype=torch.float64)
    return v.to(dtype)


def _assert_close_ulp(got, want, label):
    assert got.dtype == want.dtype and got.shape == want.shape, label
    if got.numel() == 0:
        return
    nan_got, nan_want = torch.isnan(got), torch.isnan(want)
    assert torch.equal(nan_got, nan_want), f"{label}: NaN positions differ"
    g, w = got[~nan_got], want[~nan_want]
    if got.dtype in (torch.float32, torch.float64):
        bits = torch.int32 if got.dtype == torch.float32 else torch.int64
        assert torch.equal(g.view(bits), w.view(bits)), f"{label}: not bit-identical"
        return
    gi, wi = g.view(torch.int16).to(torch.int32), w.view(torch.int16).to(torch.int32)
    same_sign = (gi < 0) == (wi < 0)
    ulps = (gi - wi).abs()
    ok = (same_sign & (ulps <= 1)) | (g == w)
    assert bool(ok.all()), f"{label}: off by more than 1 ulp at {torch.nonzero(~ok)[:5].tolist()}"


def _segments(tensors, offsets):
    array = (Segment * max(1, len(tensors)))()
    for i, (t, off) in enumerate(zip(tensors, offsets)):
        array[i] = Segment(t.data_ptr(), t.numel(), off)
    return array


@pytest.mark.parametrize("tensor_dtype", DTYPES)
@pytest.mark.parametrize("buffer_dtype", DTYPES)
@pytest.mark.parametrize("scale", [1.0, 0.1, -3.5])
def test_pack_and_unpack_match_reference(lib, tensor_dtype, buffer_dtype, scale):
    gen = torch.Generator().manual_seed(CODE[tensor_dtype] * 4 + CODE[buffer_dtype])
    total = sum(LENGTHS)
    arena = Arena(8 * (2 * total + 16 * len(LENGTHS)) + 4096)
    tensors, offsets, offset = [], [], 0
    for i, n in enumerate(LENGTHS):
        t = arena.place(n, tensor_dtype, misalign_elements=i % 3)
        t.copy_(_values(n, tensor_dtype, gen))
        tensors.append(t)
        offsets.append(offset)
        offset += n
    buffer_misalign = 1  # an odd element offset: the buffer side starts misaligned
    buffer = arena.place(total + buffer_misalign, buffer_dtype, 0)[buffer_misalign:]
    for lanes in (1, 5):
        buffer.fill_(-1)
        assert lib.ripples_host_pack(CODE[tensor_dtype], CODE[buffer_dtype],
                                     _segments(tensors, offsets), len(tensors),
                                     buffer.data_ptr(), scale, lanes) == 0
        want = torch.empty(total, dtype=buffer_dtype)
        kernels.pack([t.clone() for t in tensors], want, scale)
        _assert_close_ulp(buffer, want, f"pack lanes={lanes}")

    source = _values(total, buffer_dtype, gen)
    buffer.copy_(source)
    for lanes in (1, 7):
        for t in tensors:
            t.fill_(0)
        assert lib.ripples_host_unpack(CODE[tensor_dtype], CODE[buffer_dtype],
                                       _segments(tensors, offsets), len(tensors),
                                       buffer.data_ptr(), scale, lanes) == 0
        want = [torch.empty(n, dtype=tensor_dtype) for n in LENGTHS]
        kernels.unpack(source.clone(), want, scale)
        for n, got, w in zip(LENGTHS, tensors, want):
            _assert_close_ulp(got, w, f"unpack n={n} lanes={lanes}")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("misalign", [0, 1, 3])
def test_scale_matches_reference(lib, dtype, misalign):
    gen = torch.Generator().manual_seed(100 + CODE[dtype])
    for n in LENGTHS:
        arena = Arena(8 * n + 64)
        data = arena.place(n, dtype, misalign)
        data.copy_(_values(n, dtype, gen))
        want = data.clone()
        kernels.scale_(want, 1 / 3)
        assert lib.ripples_host_scale(CODE[dtype], data.data_ptr(), n, 1 / 3, 3) == 0
        _assert_close_ulp(data, want, f"scale n={n} misalign={misalign}")


def test_vector_path_is_taken_only_when_both_sides_can_align(lib):
    f = lib.ripples_host_vector_head_f32_f16
    f.restype = ctypes.c_longlong
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong]
    # f32 -> f16 moves 4 elements per vector: 16 source bytes, 8 destination bytes.
    assert f(4096, 8192, 100) == 0
    assert f(4096 + 4, 8192 + 2, 100) == 3   # both become aligned after 3 elements
    assert f(4096 + 4, 8192, 100) == 100     # never aligned together: all scalar
    assert f(4096 + 2, 8192, 100) == 100     # source not even element-aligned
    assert f(4096 + 4, 8192 + 2, 2) == 2     # head longer than the tensor


def test_all_fp16_and_bf16_values_convert_like_torch(lib):
    """Every finite fp16 and bf16 bit pattern, scaled by 1 (exact) and by 0.7."""
    for dtype in (torch.float16, torch.bfloat16):
        bits = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16)
        for factor in (1.0, 0.7):
            data = bits.clone().view(dtype)
            want = data.clone()
            kernels.scale_(want, factor)
            assert lib.ripples_host_scale(CODE[dtype], data.data_ptr(), data.numel(),
                                          factor, 1) == 0
            _assert_close_ulp(data, want, f"{dtype} factor={factor}")
