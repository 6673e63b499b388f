"""Gradient compression for all-reduce, with Horovod's names (``hvd.Compression.fp16``)."""
from __future__ import annotations

import torch


class Compressor:
    """Interface: ``compress(tensor) -> (tensor, ctx)``, ``decompress(tensor, ctx) -> tensor``."""

    @staticmethod
    def compress(tensor):
        raise NotImplementedError

    @staticmethod
    def decompress(tensor, ctx):
        raise NotImplementedError


class NoneCompressor(Compressor):
    @staticmethod
    def compress(tensor):
        return tensor, None

    @staticmethod
    def decompress(tensor, ctx):
        return tensor


def _cast_compressor(wire_dtype: torch.dtype):
    class _Cast(Compressor):
        """Send floating tensors as ``wire_dtype``; restore the original dtype after."""

        @staticmethod
        def compress(tensor):
            if tensor.dtype.is_floating_point and tensor.dtype != wire_dtype:
                return tensor.to(wire_dtype), tensor.dtype
            return tensor, None

        @staticmethod
        def decompress(tensor, ctx):
            return tensor if ctx is None else tensor.to(ctx)

    _Cast.__name__ = f"{str(wire_dtype)[6:].upper()}Compressor"
    return _Cast


class Compression:
    """Choices for ``compression=``: ``none``, ``fp16`` and ``bf16``."""

    none = NoneCompressor
    fp16 = _cast_compressor(torch.float16)
    bf16 = _cast_compressor(torch.bfloat16)
