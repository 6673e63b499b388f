"""Reduce-scatter: reduce over the members, then member ``i`` keeps the ``i``-th slice.

The contract is that of ``ripples.ops.collectives``.
"""
from __future__ import annotations

import math
from typing import List

import torch

from ripples.comm.mpi import as_buffer, mpi_op, reduction_dtype
from ripples.core.reduce_ops import ReduceOp
from ripples.ops.handles import Handle
from ripples.ops.process_sets import global_process_set
from ripples.ops.reduction import signature
from ripples.ops.submission import (_check_tensor, _check_tensors, _factor, _group_of, _on_host,
                                    _submit_runs, _with_compression, resolve_op, run_here)


def _reducescatter_run(tensor, op, prescale, postscale, group, me, handle, index):
    k = len(group)
    operation = mpi_op(op, tensor.dtype)
    rows = [tensor.shape[0] // k + (1 if i < tensor.shape[0] % k else 0) for i in range(k)]
    row_numel = math.prod(tensor.shape[1:])
    red_dtype = reduction_dtype(tensor.dtype)
    integer = not (tensor.dtype.is_floating_point or tensor.dtype is torch.bool)

    def scaled(t, factor):
        if factor == 1.0:
            return t
        return (t.double() * factor).trunc().to(t.dtype) if integer else t * factor

    host = _on_host(tensor)

    def run(comm, active):
        source = scaled(host.to(red_dtype), prescale).contiguous()
        output = torch.empty((rows[me], *tensor.shape[1:]), dtype=red_dtype)
        if comm is None:
            output.copy_(source)
        else:
            comm.Reduce_scatter(as_buffer(source), as_buffer(output),
                                [r * row_numel for r in rows], op=operation)
        post = postscale / k if op is ReduceOp.AVERAGE else postscale
        result = scaled(output, post).to(device=tensor.device, dtype=tensor.dtype)
        if index is None:
            handle.result = result
        else:
            handle.result[index] = result

    return run


def grouped_reducescatter_async(tensors, name=None, op=None, process_set=global_process_set,
                                prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    """Start reduce-scatters of ``tensors``: each is reduced over the members, then member
    ``i`` gets the ``i``-th slice of dimension 0 (the first ``dim0 % k`` members get one
    extra row). Default op: Average. ``synchronize`` returns the list of slices."""
    tensors = _check_tensors(tensors)
    op = resolve_op(op, None)
    rt, group = _group_of(process_set, "reducescatter")
    prescale = _factor(prescale_factor, "prescale_factor")
    postscale = _factor(postscale_factor, "postscale_factor")
    for i, tensor in enumerate(tensors):
        if tensor.dim() == 0:
            raise ValueError(f"reducescatter needs tensors with at least one dimension; "
                             f"tensors[{i}] is a scalar")
        mpi_op(op, tensor.dtype)
    handle = Handle("reducescatter", [None] * len(tensors), parts=len(tensors))
    me = group.index(rt.rank)
    runs = [_reducescatter_run(t, op, prescale, postscale, group, me, handle, i)
            for i, t in enumerate(tensors)]
    sigs = [f"{signature('reducescatter', op, t.dtype, [t.shape])} pre={prescale!r} "
            f"post={postscale!r}" for t in tensors]
    return _submit_runs("reducescatter", process_set, name, sigs, runs, [""] * len(runs), handle)


def reducescatter_async(tensor, name=None, op=None, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> Handle:
    handle = grouped_reducescatter_async([_check_tensor(tensor)], name, op, process_set,
                                         prescale_factor, postscale_factor)
    handle.finalize = lambda results: results[0]
    return handle


def grouped_reducescatter(tensors, name=None, compression=None, op=None,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> List[torch.Tensor]:
    return _with_compression(compression, _check_tensors(tensors), lambda ts: run_here(
        lambda: grouped_reducescatter_async(ts, name, op, process_set, prescale_factor,
                                            postscale_factor)))


def reducescatter(tensor, name=None, compression=None, op=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the members, then give member ``i`` the ``i``-th slice of
    dimension 0 (the first ``dim0 % k`` members get one extra row). Default op: Average."""
    return grouped_reducescatter([_check_tensor(tensor)], name, compression, op, process_set,
                                 prescale_factor, postscale_factor)[0]
