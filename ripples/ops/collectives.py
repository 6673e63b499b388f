"""Horovod's collectives on torch tensors, over MPI (host memory; CUDA through ``gpu.py``).

Contract shared by every function here: each collective has a name (``name=``, or one
counted per group for unnamed calls, so members must issue unnamed collectives in the
same order). Members of the process set (default: all ranks) run a collective once all of
them have submitted its name, whatever order they submitted names in. Members that call
one name with different shapes, dtypes or ops raise ``MismatchError`` on every member; a
member that never submits it makes the others raise ``RipplesTimeoutError`` after
``Config.timeout_s``. ``*_async`` forms return a ``Handle`` at once: the collective
progresses in the background, ``poll(handle)`` checks it without waiting and
``synchronize(handle)`` waits and returns its result.
"""
from __future__ import annotations

from typing import Sequence

import torch

from ripples import runtime as _runtime
from ripples.core.reduce_ops import ReduceOp
from ripples.ops import native_lane
from ripples.ops.handles import Handle
from ripples.ops.process_sets import global_process_set
from ripples.ops.reduction import allreduce_texts
from ripples.ops.request import Request
from ripples.ops.submission import (_check_tensor, _check_tensors, _factor, _group_of, _names,
                                    _submit, _with_compression, poll, resolve_op,  # noqa
                                    run_here, synchronize)
# The other families, re-exported: callers import every collective from this module.
from ripples.ops.broadcasts import (allgather_object, barrier, broadcast, broadcast_,  # noqa
                                    broadcast_as_joined, broadcast_async, broadcast_async_,
                                    broadcast_object)
from ripples.ops.gathers import (allgather, allgather_as_joined, allgather_async,  # noqa
                                 alltoall, alltoall_async, grouped_allgather,
                                 grouped_allgather_async, start_allgathers)
from ripples.ops.reducescatter import (grouped_reducescatter,  # noqa
                                       grouped_reducescatter_async, reducescatter,
                                       reducescatter_async)


# ---------------------------------------------------------------- all-reduce family

def _allreduce_async(tensors, outputs, op, prescale, postscale, process_set, name, what,
                     result, group=None) -> Handle:
    if group is None:
        rt, group = _group_of(process_set, what)
    else:
        rt = _runtime.current()
    prescale, postscale = _factor(prescale, "prescale_factor"), _factor(postscale,
                                                                         "postscale_factor")
    # Raises at the call (e.g. Average on bool), before anything is submitted.
    texts = [allreduce_texts(what, op, tensor, prescale, postscale, rt.config.gpu_path)
             for tensor in tensors]
    handle = Handle(what, result, parts=len(tensors))
    names = _names(rt, group, what, name, len(tensors))
    reduce = (op, prescale, postscale)
    requests = [Request(n, group, what, sig, handle, wire=wire, pair=(source, target),
                        reduce=reduce)
                for n, (sig, wire), source, target in zip(names, texts, tensors, outputs)]
    return _submit(rt, requests, handle)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set) -> Handle:
    """Start an in-place all-reduce of ``tensors`` (fused with other pending all-reduces);
    ``synchronize`` returns the list."""
    tensors = _check_tensors(tensors)
    return _allreduce_async(tensors, tensors, resolve_op(op, average), prescale_factor,
                            postscale_factor, process_set, name, "allreduce", tensors)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Start an all-reduce of ``tensors`` into new tensors (returned by ``synchronize``)."""
    tensors = _check_tensors(tensors)
    outputs = [_new_like(t) for t in tensors]
    return _allreduce_async(tensors, outputs, resolve_op(op, average), prescale_factor,
                            postscale_factor, process_set, name, "allreduce", outputs)


def _new_like(tensor: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(tensor.detach(), memory_format=torch.contiguous_format)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Start an in-place all-reduce of ``tensor``; ``synchronize`` returns it."""
    tensor = _check_tensor(tensor)
    return _allreduce_async([tensor], [tensor], resolve_op(op, average), prescale_factor,
                            postscale_factor, process_set, name, "allreduce", tensor)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Start an all-reduce of ``tensor`` into a new tensor (returned by ``synchronize``)."""
    output = _new_like(_check_tensor(tensor))
    return _allreduce_async([tensor], [output], resolve_op(op, average), prescale_factor,
                            postscale_factor, process_set, name, "allreduce", output)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return run_here(lambda: grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                    postscale_factor, process_set))


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    return _with_compression(compression, _check_tensors(tensors), lambda ts: run_here(
        lambda: grouped_allreduce_async(ts, average, name, op, prescale_factor,
                                        postscale_factor, process_set)))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """All-reduce ``tensor`` in place over the process set (default op: Average).

    A call repeated with the same shape runs through the native lane when it can
    (``ripples.ops.native_lane``): same result, same errors, less time."""
    if not isinstance(tensor, torch.Tensor):
        return run_here(lambda: allreduce_async_(tensor, average, name, op, prescale_factor,
                                                postscale_factor, process_set))
    key = ("allreduce", id(process_set), name, id(op), average, prescale_factor,
           postscale_factor, tensor.dtype, tensor.shape)
    if native_lane.run_planned(key, tensor):
        return tensor
    result = run_here(lambda: allreduce_async_(tensor, average, name, op, prescale_factor,
                                              postscale_factor, process_set))
    _plan_next(key, result, average, name, op, prescale_factor, postscale_factor, process_set)
    return result


def _plan_next(key, result, average, name, op, prescale, postscale, process_set) -> None:
    """After an all-reduce of ``key``'s shape ran through Python: plan the next ones on the
    native lane where they fit (``native_lane.register``)."""
    if prescale == 1.0 and postscale == 1.0:
        reduce_op = resolve_op(op, average)
        if reduce_op in (ReduceOp.SUM, ReduceOp.AVERAGE):
            native_lane.register(key, result, process_set.group(), "allreduce", name,
                                 reduce_op is ReduceOp.AVERAGE, holds=(process_set, op))


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """All-reduce into a new tensor (default op: Average). ``compression`` as in Horovod.

    Integer tensors reduce exactly; Average and scaling factors on them are applied as in
    Horovod (product computed in float64, truncated toward zero). A call repeated with the
    same shape (no compression) runs through the native lane when it can, as
    ``allreduce_`` does: the per-step metric all-reduce of a training loop."""
    if compression is not None or not isinstance(tensor, torch.Tensor):
        return _with_compression(compression, [_check_tensor(tensor)], lambda ts: [run_here(
            lambda: allreduce_async(ts[0], average, name, op, prescale_factor,
                                    postscale_factor, process_set))])[0]
    key = ("allreduce", id(process_set), name, id(op), average, prescale_factor,
           postscale_factor, tensor.dtype, tensor.shape)
    result = native_lane.run_planned_into(key, tensor)
    if result is not None:
        return result
    result = run_here(lambda: allreduce_async(tensor, average, name, op, prescale_factor,
                                              postscale_factor, process_set))
    _plan_next(key, result, average, name, op, prescale_factor, postscale_factor, process_set)
    return result


class SparseHandle(Handle):
    """The handle of ``sparse_allreduce_async``: ``synchronize(handle)`` or, as Horovod's
    sparse handle is a function, ``handle()`` waits and returns the sparse result."""

    __slots__ = ()

    def __call__(self) -> torch.Tensor:
        return synchronize(self)


def sparse_allreduce_async(tensor, name=None, op=None,
                           process_set=global_process_set) -> SparseHandle:
    """Start an all-reduce of a sparse COO tensor, as Horovod does: every member's indices
    and values are all-gathered, and ``synchronize(handle)`` (or ``handle()``) returns the
    sparse sum (divided by the number of members for Average; op must be Average or Sum)."""
    tensor = _check_tensor(tensor)
    if not tensor.is_sparse:
        raise ValueError("sparse_allreduce_async takes a sparse COO tensor; use allreduce_async "
                         "for dense tensors")
    op = resolve_op(op, None)
    if op not in (ReduceOp.AVERAGE, ReduceOp.SUM):
        raise ValueError(f"op={op} is not supported for sparse tensors; use Average or Sum")
    rt, group = _group_of(process_set, "sparse_allreduce")
    coalesced = tensor.detach().coalesce()
    parts = [coalesced.indices().t().contiguous(), coalesced.values().contiguous()]
    size, members = tensor.shape, len(group)

    def assemble(gathered):
        values = gathered[1] / members if op is ReduceOp.AVERAGE else gathered[1]
        # Every index came from a coalesced tensor of this shape: nothing to check.
        return torch.sparse_coo_tensor(gathered[0].t(), values, size, check_invariants=False)

    name = name if name is not None else rt.engine.auto_name(group, "sparse_allreduce")
    handle = start_allgathers(parts, name, process_set, SparseHandle)
    handle.finalize = assemble
    return handle
