"""Partial All-Reduce (P-Reduce): an all-reduce among the members of a group only.

``partial_allreduce(x, group)`` with op Average leaves every member holding the mean of the
members' tensors, the block-averaging step of decentralized training; ranks outside the
group are not involved at all. A group of one is a local copy.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import torch

from ripples import runtime as _runtime
from ripples.comm.groups import normalize_group
from ripples.ops.collectives import _allreduce_async, _check_tensor, _check_tensors, run_here
from ripples.ops import native_lane
from ripples.ops.handles import Handle
from ripples.core.reduce_ops import ReduceOp, check_op

WHAT = "partial_allreduce"


def _prepare(group: Iterable[int], op):
    rt = _runtime.current()
    return rt, normalize_group(group, rt.rank, rt.size), check_op(op)


def grouped_partial_allreduce_async_(tensors: Sequence[torch.Tensor], group: Iterable[int],
                                     op=ReduceOp.AVERAGE, name=None) -> Handle:
    """Start an in-place P-Reduce of ``tensors`` over ``group`` (fused per dtype);
    ``synchronize`` returns the list.

    Every member of ``group`` (an iterable of world ranks containing the caller) must call
    it with the same group, shapes, dtypes and op (and name, if given). Raises ValueError
    on the calling rank if it is not a member or the group has duplicate or out-of-range
    ranks.
    """
    tensors = _check_tensors(tensors)
    rt, members, op = _prepare(group, op)
    return _allreduce_async(tensors, tensors, op, 1.0, 1.0, None, name, WHAT, tensors,
                            group=members)


def grouped_partial_allreduce_(tensors: Sequence[torch.Tensor], group: Iterable[int],
                               op=ReduceOp.AVERAGE, name=None) -> Sequence[torch.Tensor]:
    """P-Reduce ``tensors`` in place over ``group`` (see ``grouped_partial_allreduce_async_``)."""
    if type(tensors) in (list, tuple) and len(tensors) == 1:
        partial_allreduce_(tensors[0], group, op, name)
        return tensors
    return run_here(lambda: grouped_partial_allreduce_async_(tensors, group, op, name))


def partial_allreduce_(tensor: torch.Tensor, group: Iterable[int], op=ReduceOp.AVERAGE,
                       name=None) -> torch.Tensor:
    """P-Reduce ``tensor`` in place over ``group`` and return it (see the module doc).
    A call repeated with the same group and shape runs through the native lane when it can
    (``ripples.ops.native_lane``)."""
    if type(group) is list:
        group = tuple(group)
    if type(group) is not tuple or not isinstance(tensor, torch.Tensor):
        run_here(lambda: grouped_partial_allreduce_async_([tensor], group, op, name))
        return tensor
    key = (WHAT, group, id(op), name, tensor.dtype, tensor.shape)
    if native_lane.run_planned(key, tensor):
        return tensor
    run_here(lambda: grouped_partial_allreduce_async_([tensor], group, op, name))
    if op in (ReduceOp.SUM, ReduceOp.AVERAGE):
        rt = _runtime.current()
        native_lane.register(key, tensor, normalize_group(group, rt.rank, rt.size), WHAT, name,
                             op is ReduceOp.AVERAGE, holds=op)
    return tensor


def partial_allreduce(tensor: torch.Tensor, group: Iterable[int], op=ReduceOp.AVERAGE,
                      name=None) -> torch.Tensor:
    """Return a new tensor: the P-Reduce of ``tensor`` over ``group``."""
    output = _check_tensor(tensor).detach().clone(memory_format=torch.contiguous_format)
    return partial_allreduce_(output, group, op, name)


def partial_allreduce_async_(tensor: torch.Tensor, group: Iterable[int], op=ReduceOp.AVERAGE,
                             name=None) -> Handle:
    """Start an in-place P-Reduce; ``synchronize`` returns ``tensor``."""
    handle = grouped_partial_allreduce_async_([_check_tensor(tensor)], group, op, name)
    handle.result = tensor
    return handle


def partial_allreduce_async(tensor: torch.Tensor, group: Iterable[int], op=ReduceOp.AVERAGE,
                            name=None) -> Handle:
    """Start a P-Reduce into a new tensor (returned by ``synchronize``)."""
    output = _check_tensor(tensor).detach().clone(memory_format=torch.contiguous_format)
    return partial_allreduce_async_(output, group, op, name)
