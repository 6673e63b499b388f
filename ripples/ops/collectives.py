"""Horovod's collectives on torch tensors, over MPI (host memory).

Contract shared by every function here: every member of the process set (default: all
ranks) calls the same collectives in the same order. Members that disagree on shape, dtype
or op raise ``MismatchError`` on every member; a member that never arrives makes the others
raise ``RipplesTimeoutError`` after ``Config.timeout_s``.
"""
from __future__ import annotations

import pickle
from typing import List, Optional, Sequence

import numpy as np
import torch
from mpi4py import MPI

from ripples import runtime as _runtime
from ripples.comm.mpi import as_buffer, mpi_op, reduction_dtype
from ripples.ops.handles import Handle
from ripples.ops.process_sets import ProcessSet, global_process_set
from ripples.ops.reduce_ops import ReduceOp, check_op
from ripples.ops.reduction import reduce_pairs, signature, split_by_dtype


def resolve_op(op, average) -> ReduceOp:
    """Horovod's deprecated ``average=`` flag and ``op=`` combined into one ReduceOp."""
    if average is not None:
        if op is not None:
            raise ValueError("pass either op= or the deprecated average=, not both")
        return ReduceOp.AVERAGE if average else ReduceOp.SUM
    return ReduceOp.AVERAGE if op is None else check_op(op)


def _check_tensor(tensor, argument: str = "tensor") -> torch.Tensor:
    if not isinstance(tensor, torch.Tensor):
        raise TypeError(f"{argument} must be a torch.Tensor, got {type(tensor).__name__}")
    return tensor


def _group_of(process_set: ProcessSet, what: str):
    rt = _runtime.current()
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    group = process_set.group()
    if rt.rank not in group:
        raise ValueError(f"rank {rt.rank} called {what} on {process_set}, which does not "
                         "contain it; only members may call it")
    return rt, group


# ---------------------------------------------------------------- all-reduce family

def _queue_allreduce(pairs, op, prescale, postscale, group, what, result) -> Handle:
    rt = _runtime.current()
    for pair in pairs:
        mpi_op(op, pair[0].dtype)  # reject e.g. Average on integers at the call, not the flush
    handle = Handle(what, result)
    return rt.queue.submit(handle, pairs, op, float(prescale), float(postscale), group, what)


def grouped_allreduce_async_(tensors: Sequence[torch.Tensor], average=None, name=None, op=None,
                             prescale_factor=1.0, postscale_factor=1.0,
                             process_set=global_process_set, _outputs=None) -> Handle:
    """Queue an in-place all-reduce of ``tensors``; they are fused with other queued calls."""
    tensors = [_check_tensor(t, "tensors[i]") for t in tensors]
    op = resolve_op(op, average)
    _, group = _group_of(process_set, "allreduce")
    outputs = tensors if _outputs is None else _outputs
    return _queue_allreduce(list(zip(tensors, outputs)), op, prescale_factor, postscale_factor,
                            group, "allreduce", outputs)


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set) -> Handle:
    """Queue an all-reduce of ``tensors`` into new tensors (returned by ``synchronize``)."""
    outputs = [torch.empty_like(_check_tensor(t, "tensors[i]"),
                                memory_format=torch.contiguous_format) for t in tensors]
    return grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                    postscale_factor, process_set, _outputs=outputs)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> Handle:
    handle = grouped_allreduce_async_([_check_tensor(tensor)], average, name, op,
                                      prescale_factor, postscale_factor, process_set)
    handle.result = tensor
    return handle


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> Handle:
    handle = grouped_allreduce_async([_check_tensor(tensor)], average, name, op,
                                     prescale_factor, postscale_factor, process_set)
    handle.result = handle.result[0]
    return handle


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0, process_set=global_process_set):
    return _with_compression(compression, tensors, lambda ts: synchronize(grouped_allreduce_async(
        ts, average, name, op, prescale_factor, postscale_factor, process_set)))


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """All-reduce ``tensor`` in place over the process set (default op: Average)."""
    _check_tensor(tensor)
    op = resolve_op(op, average)
    rt, group = _group_of(process_set, "allreduce")
    rt.queue.flush()
    reduce_pairs(rt, group, [(tensor, tensor)], op, float(prescale_factor),
                 float(postscale_factor), "allreduce")
    return tensor


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """All-reduce into a new tensor (default op: Average). ``compression`` as in Horovod."""
    def run(tensors):
        (source,) = tensors
        output = torch.empty_like(source, memory_format=torch.contiguous_format)
        op_ = resolve_op(op, average)
        rt, group = _group_of(process_set, "allreduce")
        rt.queue.flush()
        reduce_pairs(rt, group, [(source, output)], op_, float(prescale_factor),
                     float(postscale_factor), "allreduce")
        return [output]
    return _with_compression(compression, [_check_tensor(tensor)], run)[0]


def _with_compression(compression, tensors, run) -> List[torch.Tensor]:
    if compression is None:
        return run(list(tensors))
    packed = [compression.compress(t) for t in tensors]
    results = run([p[0] for p in packed])
    return [compression.decompress(r, p[1]) for r, p in zip(results, packed)]


def synchronize(handle: Handle):
    """Wait for an asynchronous collective and return its result (raises its error)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize takes a handle from an *_async call, got {handle!r}")
    if not handle.done:
        _runtime.current().queue.flush()
    if handle.error is not None:
        raise handle.error
    return handle.result


def poll(handle: Handle) -> bool:
    """True once the collective is done. Polling runs the queued collectives (collectively)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"poll takes a handle from an *_async call, got {handle!r}")
    if not handle.done:
        _runtime.current().queue.flush()
    return handle.done


# ---------------------------------------------------------------- data movement

def _prepare(process_set, what: str, sig: str):
    rt, group = _group_of(process_set, what)
    rt.queue.flush()
    comm, _ = rt.communicator(group, what, sig)
    return rt, group, comm


def _contiguous_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def broadcast_(tensor, root_rank: int, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` on every member with its value on world rank ``root_rank``."""
    _check_tensor(tensor)
    rt, group = _group_of(process_set, "broadcast")
    if root_rank not in group:
        raise ValueError(f"root_rank={root_rank} is not a member of {process_set} (on rank {rt.rank})")
    sig = f"broadcast root={root_rank} dtype={tensor.dtype} shape={tuple(tensor.shape)}"
    _, _, comm = _prepare(process_set, "broadcast", sig)
    if len(group) == 1:
        return tensor
    target = tensor if tensor.is_contiguous() else _contiguous_copy(tensor)
    comm.Bcast(as_buffer(target), root=group.index(root_rank))
    if target is not tensor:
        tensor.copy_(target)
    return tensor


def broadcast(tensor, root_rank: int, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return a new tensor holding ``tensor``'s value on world rank ``root_rank``."""
    return broadcast_(_contiguous_copy(_check_tensor(tensor)), root_rank, name, process_set)


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=global_process_set):
    """Return the picklable ``obj`` of world rank ``root_rank`` on every member."""
    rt, group = _group_of(process_set, "broadcast_object")
    if root_rank not in group:
        raise ValueError(f"root_rank={root_rank} is not a member of {process_set} (on rank {rt.rank})")
    _, _, comm = _prepare(process_set, "broadcast_object", f"broadcast_object root={root_rank}")
    return obj if len(group) == 1 else comm.bcast(obj, root=group.index(root_rank))


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every member's picklable ``obj``, in rank order."""
    _, group, comm = _prepare(process_set, "allgather_object", "allgather_object")
    return [obj] if len(group) == 1 else comm.allgather(obj)


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenate every member's ``tensor`` along dimension 0 (which may differ per rank)."""
    _check_tensor(tensor)
    if tensor.dim() == 0:
        raise ValueError("allgather needs a tensor with at least one dimension; "
                         "use tensor.reshape(1)")
    sig = f"allgather dtype={tensor.dtype} row={tuple(tensor.shape[1:])}"
    _, group, comm = _prepare(process_set, "allgather", sig)
    source = tensor if tensor.is_contiguous() else _contiguous_copy(tensor)
    if len(group) == 1:
        return _contiguous_copy(source)
    rows = np.array(comm.allgather(int(tensor.shape[0])), dtype=np.int64)
    row_numel = int(np.prod(tensor.shape[1:], dtype=np.int64))
    output = torch.empty((int(rows.sum()), *tensor.shape[1:]), dtype=tensor.dtype)
    counts = rows * row_numel
    comm.Allgatherv(as_buffer(source), [as_buffer(output), counts.tolist()])
    return output


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Send ``splits[i]`` rows of ``tensor`` (in order) to member ``i``; returns
    ``(received, received_splits)``. Without ``splits`` dimension 0 is divided evenly."""
    _check_tensor(tensor)
    rt, group = _group_of(process_set, "alltoall")
    k = len(group)
    if tensor.dim() == 0:
        raise ValueError("alltoall needs a tensor with at least one dimension")
    if splits is None:
        if tensor.shape[0] % k:
            raise ValueError(f"alltoall: dimension 0 ({tensor.shape[0]}) is not divisible by the "
                             f"number of members ({k}); pass splits= (on rank {rt.rank})")
        splits = [tensor.shape[0] // k] * k
    splits = [int(s) for s in (splits.tolist() if isinstance(splits, torch.Tensor) else splits)]
    if len(splits) != k or any(s < 0 for s in splits) or sum(splits) != tensor.shape[0]:
        raise ValueError(f"alltoall: splits={splits} must have {k} non-negative entries summing "
                         f"to dimension 0 ({tensor.shape[0]}) (on rank {rt.rank})")
    sig = f"alltoall dtype={tensor.dtype} row={tuple(tensor.shape[1:])}"
    _, _, comm = _prepare(process_set, "alltoall", sig)
    source = tensor if tensor.is_contiguous() else _contiguous_copy(tensor)
    if k == 1:
        return _contiguous_copy(source), torch.tensor(splits, dtype=torch.int32)
    row_numel = int(np.prod(tensor.shape[1:], dtype=np.int64))
    received = np.empty(k, dtype=np.int64)
    comm.Alltoall(np.array(splits, dtype=np.int64), received)
    output = torch.empty((int(received.sum()), *tensor.shape[1:]), dtype=tensor.dtype)
    send_counts = [s * row_numel for s in splits]
    recv_counts = (received * row_numel).tolist()
    comm.Alltoallv([as_buffer(source), send_counts], [as_buffer(output), recv_counts])
    return output, torch.from_numpy(received.astype(np.int32))


def reducescatter(tensor, name=None, compression=None, op=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the members, then give member ``i`` the ``i``-th slice of
    dimension 0 (the first ``dim0 % k`` members get one extra row). Default op: Average."""
    _check_tensor(tensor)
    op = resolve_op(op, None)
    rt, group = _group_of(process_set, "reducescatter")
    k = len(group)
    if tensor.dim() == 0:
        raise ValueError("reducescatter needs a tensor with at least one dimension")
    operation = mpi_op(op, tensor.dtype)
    sig = signature("reducescatter", op, tensor.dtype, [tensor.shape])
    _, _, comm = _prepare(process_set, "reducescatter", sig)
    rows = [tensor.shape[0] // k + (1 if i < tensor.shape[0] % k else 0) for i in range(k)]
    row_numel = int(np.prod(tensor.shape[1:], dtype=np.int64))
    red_dtype = reduction_dtype(tensor.dtype)
    source = tensor.detach().to(red_dtype).contiguous()
    if prescale_factor != 1.0:
        source = source * prescale_factor
    me = group.index(rt.rank)
    output = torch.empty((rows[me], *tensor.shape[1:]), dtype=red_dtype)
    if k == 1:
        output.copy_(source)
    else:
        comm.Reduce_scatter(as_buffer(source), as_buffer(output),
                            [r * row_numel for r in rows], op=operation)
    post = postscale_factor / k if op is ReduceOp.AVERAGE else postscale_factor
    if post != 1.0:
        output.mul_(post)
    return output.to(tensor.dtype)


def barrier(process_set=global_process_set) -> None:
    """Return once every member has called it (bounded by ``Config.timeout_s``)."""
    _prepare(process_set, "barrier", "barrier")
