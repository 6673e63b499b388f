"""Fusion-buffer packing and in-place scaling for the collectives.

CPU tensors run the torch reference (``reference.py``); CUDA tensors run the kernels in
``csrc/`` compiled at first use through cupy (``cuda.py``), or the torch reference when
cupy is not installed (``ripples.kernels.cuda.available()`` tells which). Both follow one arithmetic
contract: a scaled element is ``cast<dst>(cast<compute>(x) * scale)``, ``compute`` being
float64 when source or destination is float64 and float32 otherwise, so fp16/bf16 values
are computed in fp32 and rounded once.
"""
from __future__ import annotations

import math
from typing import Sequence

import torch

from . import reference

__all__ = ["pack", "unpack", "scale_"]


def pack(tensors: Sequence[torch.Tensor], out: torch.Tensor, scale: float = 1.0) -> None:
    """Copy the tensors' elements one after another into the 1-D ``out``, times ``scale``.

    Each tensor contributes its elements in row-major order (it may be non-contiguous);
    tensor ``i`` lands at ``out[o_i : o_i + numel_i]`` with ``o_i`` the sum of the previous
    numels. ``out`` may have a different floating dtype than the tensors (e.g. a float32
    buffer for float16 tensors: the cast and multiply use fp32 arithmetic). Elements of
    ``out`` past the total numel are left untouched.

    Raises ValueError if ``out`` is not 1-D, is too short, or devices differ, or if ``scale``
    is not 1.0 while a tensor or ``out`` is an integer/bool tensor; TypeError for non-tensors.
    """
    tensors = _check_tensors(tensors, "tensors")
    _check_buffer(out, "out", tensors)
    scale = _check_scale(scale, "scale", tensors, out)
    if not tensors:
        return
    if out.is_cuda and _cuda_kernels():
        from . import cuda
        cuda.pack(tensors, out, scale)
    else:
        reference.pack(tensors, out, scale)


def unpack(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], scale: float = 1.0) -> None:
    """Inverse of :func:`pack`: write consecutive slices of the 1-D ``buffer``, times
    ``scale`` and cast to each tensor's dtype, into each tensor in place (row-major, the
    tensors may be non-contiguous). Same errors as :func:`pack`."""
    tensors = _check_tensors(tensors, "tensors")
    _check_buffer(buffer, "buffer", tensors)
    scale = _check_scale(scale, "scale", tensors, buffer)
    if not tensors:
        return
    if buffer.is_cuda and _cuda_kernels():
        from . import cuda
        cuda.unpack(buffer, tensors, scale)
    else:
        reference.unpack(buffer, tensors, scale)


def scale_(tensor: torch.Tensor, factor: float) -> None:
    """Multiply ``tensor`` in place by ``factor``; fp16/bf16 are computed in fp32 and
    rounded once. Integer/bool tensors accept only ``factor == 1.0`` (ValueError otherwise)."""
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"tensor must be a torch.Tensor, got {type(tensor).__name__}")
    factor = _check_scale(factor, "factor", [tensor], tensor)
    if factor == 1.0 or tensor.numel() == 0:
        return
    if tensor.is_cuda and _cuda_kernels():
        from . import cuda
        cuda.scale_(tensor, factor)
    else:
        reference.scale_(tensor, factor)


_CUDA_KERNELS = None


def _cuda_kernels() -> bool:
    """Whether CUDA tensors go to the compiled kernels (decided once per process)."""
    global _CUDA_KERNELS
    if _CUDA_KERNELS is None:
        from . import cuda
        _CUDA_KERNELS = cuda.available()
    return _CUDA_KERNELS


def _check_tensors(tensors, name: str) -> list:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{name} must be a sequence of tensors, got a single tensor; "
                        f"wrap it in a list")
    tensors = list(tensors)
    for i, t in enumerate(tensors):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
    return tensors


def _check_buffer(buffer, name: str, tensors: list) -> None:
    if not isinstance(buffer, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(buffer).__name__}")
    if buffer.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(buffer.shape)}; "
                         f"pass a flat buffer (e.g. buffer.view(-1))")
    total = sum(t.numel() for t in tensors)
    if buffer.numel() < total:
        raise ValueError(f"{name} holds {buffer.numel()} elements but the tensors have "
                         f"{total}; allocate at least {total}")
    # Cheap flag first (this runs every step for every tensor); full comparison on doubt.
    if not buffer.is_cpu or any(not t.is_cpu for t in tensors):
        where, on_cuda = buffer.get_device(), buffer.is_cuda  # ints and flags: cheap
        for i, t in enumerate(tensors):
            if t.get_device() != where or t.is_cuda != on_cuda:
                raise ValueError(f"tensors[{i}] is on {t.device} but {name} is on "
                                 f"{buffer.device}; move them to one device")


def _check_scale(scale, name: str, tensors: list, buffer: torch.Tensor) -> float:
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"{name} must be a float, got {type(scale).__name__}")
    scale = float(scale)
    if scale == 1.0:
        return scale
    if not math.isfinite(scale):
        raise ValueError(f"{name} must be finite, got {scale}")
    for t in [buffer, *tensors]:
        if not t.is_floating_point():
            raise ValueError(f"{name} must be 1.0 for {t.dtype} tensors (integer and bool "
                             f"tensors are copied, never scaled), got {scale}")
    return scale
