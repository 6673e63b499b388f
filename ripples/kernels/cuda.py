"""The CUDA kernels of ``csrc/``, compiled at first use through cupy (NVRTC) and launched on
torch CUDA tensors, on torch's current stream.

Anything cupy cannot do here (no cupy, no GPU) raises RuntimeError carrying the original
error; :func:`available` says beforehand whether the kernels can be used.
"""
from __future__ import annotations

import collections
import re
import threading
from typing import Sequence

import torch

from . import reference
from .sources import KERNEL_FILES, read_source, source_dir
from .streams import current_stream_handle

SUFFIX = {torch.float16: "f16", torch.bfloat16: "bf16", torch.float32: "f32",
          torch.float64: "f64"}
MAX_SEGMENTS_PER_LAUNCH = 65535  # gridDim.y limit: blockIdx.y selects the segment
_SEGMENT_CACHE_SIZE = 64

_lock = threading.Lock()
_modules: dict = {}
_segment_tables: "collections.OrderedDict" = collections.OrderedDict()
_geometry: dict = {}


def _import_cupy():
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError("ripples' CUDA kernels need cupy (pip install 'ripples-mpi[gpu]' or "
                           f"the cupy-cuda* wheel matching your CUDA): {exc}") from exc
    return cupy


def available() -> bool:
    """True when cupy imports and torch sees a CUDA device."""
    try:
        _import_cupy()
    except RuntimeError:
        return False
    return torch.cuda.is_available()


def geometry() -> dict:
    """Launch constants, read from ``csrc/launch.cuh`` so both sides agree."""
    if not _geometry:
        text = (source_dir() / "launch.cuh").read_text(encoding="utf-8")
        threads = int(re.search(r"#define RIPPLES_THREADS (\d+)", text).group(1))
        max_blocks = int(re.search(r"#define RIPPLES_MAX_BLOCKS (\d+)", text).group(1))
        per_thread = int(re.search(r"RIPPLES_THREADS \* (\d+)\)", text).group(1))
        _geometry.update(threads=threads, max_blocks=max_blocks,
                         elements_per_block=threads * per_thread)
    return _geometry


def load_module(device_index: int):
    """The compiled kernel module for one device (compiled once per process and device).

    Raises RuntimeError without cupy or without a GPU, or when compilation fails (the
    message names the real source file and line)."""
    cupy = _import_cupy()
    if not torch.cuda.is_available():
        raise RuntimeError("ripples' CUDA kernels were asked for, but torch sees no CUDA device")
    with _lock:
        module = _modules.get(device_index)
        if module is not None:
            return module
        code = "\n".join(read_source(name) for name in KERNEL_FILES)
        with cupy.cuda.Device(device_index):
            module = cupy.RawModule(code=code, options=("-std=c++17", f"-I{source_dir()}"))
            try:
                module.compile()
            except Exception as exc:  # cupy's CompileException carries the NVRTC log
                raise RuntimeError(f"compiling ripples' CUDA kernels failed: {exc}") from exc
        _modules[device_index] = module
        return module


_kernels: dict = {}  # (device index, kernel name) -> cupy RawKernel
# (device index, torch stream handle) -> cupy ExternalStream over it: the handle alone is
# not enough (every device's default stream is handle 0)
_streams: dict = {}
_MAX_STREAMS = 64  # a script that makes streams as it goes must not grow this for good


def _launch(device_index: int, name: str, grid: tuple, args: tuple) -> None:
    # The lookups are cached: a training step launches a few kernels per fused run, and
    # cupy's own per-launch objects cost more than the kernels on small buffers.
    cupy = _import_cupy()
    kernel = _kernels.get((device_index, name))
    if kernel is None:
        kernel = _kernels[(device_index, name)] = load_module(device_index).get_function(name)
    key = (device_index, current_stream_handle(device_index))
    stream = _streams.get(key)
    if stream is None:
        if len(_streams) >= _MAX_STREAMS:
            _streams.clear()
        stream = _streams[key] = cupy.cuda.ExternalStream(key[1], device_index)
    with cupy.cuda.Device(device_index), stream:
        kernel(grid, (geometry()["threads"],), args)


def _blocks(max_numel: int) -> int:
    g = geometry()
    return max(1, min(g["max_blocks"], -(-max_numel // g["elements_per_block"])))


def _segment_table(device: torch.device, rows: list) -> torch.Tensor:
    """Device copy of (ptr, numel, offset) rows, cached: a training loop packs the same
    parameters every step, so the upload happens once."""
    key = (device.index, tuple(rows))
    with _lock:
        hit = _segment_tables.get(key)
        if hit is not None:
            _segment_tables.move_to_end(key)
            return hit[1]
    host = torch.tensor(rows, dtype=torch.int64).pin_memory()
    table = host.to(device, non_blocking=True)
    with _lock:
        _segment_tables[key] = (host, table)
        while len(_segment_tables) > _SEGMENT_CACHE_SIZE:
            _segment_tables.popitem(last=False)
    return table


def _run_segments(kind: str, pieces: list, buffer: torch.Tensor, scale: float) -> None:
    """One launch per tensor dtype (and per 65535 tensors) over ``(dtype, ptr, numel,
    offset)`` pieces of non-empty tensors."""
    import numpy as np

    by_dtype: dict = {}
    for dtype, ptr, numel, offset in pieces:
        by_dtype.setdefault(dtype, []).append((ptr, numel, offset))
    device_index = buffer.device.index
    for dtype, rows in by_dtype.items():
        if kind == "pack":
            name = f"ripples_pack_{SUFFIX[dtype]}_{SUFFIX[buffer.dtype]}"
        else:
            name = f"ripples_unpack_{SUFFIX[buffer.dtype]}_{SUFFIX[dtype]}"
        for start in range(0, len(rows), MAX_SEGMENTS_PER_LAUNCH):
            chunk = rows[start:start + MAX_SEGMENTS_PER_LAUNCH]
            table = _segment_table(buffer.device, chunk)
            grid = (_blocks(max(row[1] for row in chunk)), len(chunk))
            _launch(device_index, name, grid,
                    (np.uint64(table.data_ptr()), np.uint64(buffer.data_ptr()),
                     np.float64(scale)))


# pack and unpack read each tensor's attributes once: with many small tensors (a model's
# biases and norms) the host side of a launch costs more than the copy itself.

def pack(tensors: Sequence[torch.Tensor], out: torch.Tensor, scale: float) -> None:
    """CUDA :func:`ripples.kernels.pack` (arguments already validated)."""
    if out.dtype not in SUFFIX or not out.is_contiguous():
        reference.pack(tensors, out, scale)
        return
    pieces, copies, offset = [], [], 0
    for t in tensors:
        dtype, numel = t.dtype, t.numel()
        if dtype not in SUFFIX:
            reference.pack(tensors, out, scale)
            return
        if numel:
            if not t.is_contiguous():
                t = t.contiguous()
                copies.append(t)  # alive until the launch is queued behind its copy
            pieces.append((dtype, t.data_ptr(), numel, offset))
        offset += numel
    _run_segments("pack", pieces, out, scale)


def unpack(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], scale: float) -> None:
    """CUDA :func:`ripples.kernels.unpack` (arguments already validated)."""
    if buffer.dtype not in SUFFIX or not buffer.is_contiguous():
        reference.unpack(buffer, tensors, scale)
        return
    pieces, strided, offset = [], [], 0
    for t in tensors:
        dtype, numel = t.dtype, t.numel()
        if dtype not in SUFFIX:
            reference.unpack(buffer, tensors, scale)
            return
        if numel:
            target = t
            if not t.is_contiguous():
                target = torch.empty(t.shape, dtype=dtype, device=t.device)
                strided.append((t, target))
            pieces.append((dtype, target.data_ptr(), numel, offset))
        offset += numel
    _run_segments("unpack", pieces, buffer, scale)
    for t, staging in strided:
        t.copy_(staging)


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """CUDA :func:`ripples.kernels.scale_` (arguments already validated)."""
    import numpy as np

    if tensor.dtype not in SUFFIX or not tensor.is_contiguous():
        reference.scale_(tensor, factor)
        return
    _launch(tensor.device.index, f"ripples_scale_{SUFFIX[tensor.dtype]}",
            (_blocks(tensor.numel()),),
            (np.uint64(tensor.data_ptr()), np.int64(tensor.numel()), np.float64(factor)))
