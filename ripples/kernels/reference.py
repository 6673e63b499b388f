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
    else:
        # TensorIterator computes in the (wider or equal) source's opmath type and casts
        # the result into dst once.
        torch.mul(src, scale, out=dst)


def pack(tensors: Sequence[torch.Tensor], out: torch.Tensor, scale: float) -> None:
    offset = 0
    same_dtype = all(t.dtype == out.dtype for t in tensors)
    if same_dtype and len(tensors) > 1:
        # One C++ call instead of a Python loop: the fusion path is per-step hot.
        total = sum(t.numel() for t in tensors)
        region = out.narrow(0, 0, total)
        torch.cat([t.reshape(-1) for t in tensors], out=region)
        if scale != 1.0:
            region.mul_(scale)
        return
    for t in tensors:
        n = t.numel()
        scaled_copy(out.narrow(0, offset, n).view(t.shape), t, scale)
        offset += n


def unpack(buffer: torch.Tensor, tensors: Sequence[torch.Tensor], scale: float) -> None:
    offset = 0
    for t in tensors:
        n = t.numel()
        scaled_copy(t, buffer.narrow(0, offset, n).view(t.shape), scale)
        offset += n


def scale_(tensor: torch.Tensor, factor: float) -> None:
    if factor != 1.0:
        tensor.mul_(factor)
