"""Torch reference implementation of pack, unpack and scale (the CPU path).

Arithmetic contract shared with the CUDA kernels (csrc/common.cuh): a scaled element is
``cast<dst>(cast<compute>(x) * compute(scale))`` where ``compute`` is float64 when the
source or destination is float64 and float32 otherwise, so fp16/bf16 are computed in fp32
and rounded once. With ``scale == 1.0`` an element is a plain cast.

Arguments are assumed validated by ``ripples.kernels``; these functions only compute.
"""
from __future__ import annotations

from typing import Sequence

import torch

_ORDER = {torch.float16: 0, torch.bfloat16: 0, torch.float32: 1, torch.float64: 2}


def _widens(src: torch.dtype, dst: torch.dtype) -> bool:
    """True when writing ``src`` values into ``dst`` loses nothing, so the multiply can run
    in ``dst`` after an exact cast (torch would otherwise compute in the narrower ``src``)."""
    return _ORDER.get(dst, -1) > _ORDER.get(src, -1)


def scaled_copy(dst: torch.Tensor, src: torch.Tensor, scale: float) -> None:
    """``dst[...] = src * scale`` elementwise (same shape), rounding once into ``dst``."""
    if scale == 1.0:
        dst.copy_(src)
    elif _widens(src.dtype, dst.dtype):
        dst.copy_(src)
        dst.mul_(scale)
    elif src.dtype != dst.dtype and src.element_size() == 2 and dst.element_size() == 2:
        # fp16 <-> bf16: torch would round to the source format first; go through fp32.
        dst.copy_(src.float().mul_(scale))
    else:
        # TensorIterator computes in the (wider or equal) source's opmath type and casts
        # the result into dst once.
        torch.mul(src, scale, out=dst)


def pack(tensors: Sequence[torch.Tensor], out: torch.Tensor, scale: float) -> None:
    if scale != 1.0 and any(not _widens(t.dtype, out.dtype) and t.dtype != out.dtype
                            for t in tensors):
        # Narrowing with a scale: multiply before the cast so it rounds once.
        offset = 0
        for t in tensors:
            n = t.numel()
            scaled_copy(out.narrow(0, offset, n).view(t.shape), t, scale)
            offset += n
        return
    # One C++ call for all tensors (the fusion path runs every step); the cast into out is
    # exact here, so the multiply afterwards in out's dtype rounds once.
    total = sum(t.numel() for t in tensors)
    region = out.narrow(0, 0, total)
    torch.cat([t if t.dim() == 1 else t.reshape(-1) for t in tensors], out=region)
    if scale != 1.0:
        region.mul_(scale)


def unpack(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], scale: float) -> None:
    total = sum(t.numel() for t in tensors)
    narrowing = any(not _widens(buffer.dtype, t.dtype) and t.dtype != buffer.dtype
                    for t in tensors)
    if _HAS_FOREACH and (scale == 1.0 or not narrowing):
        views = _unflatten(buffer.narrow(0, 0, total), tensors)
        torch._foreach_copy_(tensors, views)
        if scale != 1.0:
            torch._foreach_mul_(tensors, scale)
        return
    offset = 0
    for t in tensors:
        n = t.numel()
        scaled_copy(t, buffer.narrow(0, offset, n).view(t.shape), scale)
        offset += n


def _unflatten(flat: torch.Tensor, like: Sequence[torch.Tensor]):
    """Views of ``flat`` shaped like ``like`` (1-D ones need no reshaping view)."""
    pieces = torch.split(flat, [t.numel() for t in like])
    return [p if t.dim() == 1 else p.view(t.shape) for p, t in zip(pieces, like)]


# Private but long-standing torch APIs (used by DDP); fall back to a loop without them.
_HAS_FOREACH = hasattr(torch, "_foreach_copy_") and hasattr(torch, "_foreach_mul_")


def scale_(tensor: torch.Tensor, factor: float) -> None:
    if factor != 1.0:
        tensor.mul_(factor)
