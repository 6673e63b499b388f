"""The one routine that all-reduces a list of tensors over a group of ranks.

Both the synchronous calls and the fused flush of queued asynchronous calls end here, as
do Partial All-Reduce and the decentralized optimizer's parameter averaging.
"""
from __future__ import annotations

import functools
import zlib
from typing import List, Sequence, Tuple

import torch
from mpi4py import MPI

from ripples import kernels
from ripples.comm.groups import Group
from ripples.comm.mpi import as_buffer, mpi_op, reduction_dtype
from ripples.ops.gpu import reduce_on_gpu
from ripples.ops.reduce_ops import ReduceOp

Pair = Tuple[torch.Tensor, torch.Tensor]  # (input, output); the same tensor for in-place


def signature(what: str, op: ReduceOp, dtype: torch.dtype, shapes: Sequence[torch.Size]) -> str:
    """A short text that must be equal on all members: op, dtype and every shape."""
    return _signature(what, op, dtype, tuple(shapes))


@functools.lru_cache(maxsize=4096)  # training repeats the same few calls every step
def _signature(what: str, op: ReduceOp, dtype: torch.dtype, shapes: tuple) -> str:
    text = f"{what} op={op} dtype={str(dtype)[6:]} shapes={[tuple(s) for s in shapes]}"
    if len(text) > 300:
        text = f"{text[:260]}... crc={zlib.crc32(text.encode()):08x}"
    return text


def reduce_pairs(runtime, group: Group, pairs: Sequence[Pair], op: ReduceOp,
                 prescale: float = 1.0, postscale: float = 1.0, what: str = "allreduce") -> None:
    """All-reduce ``pairs`` (inputs into outputs) over ``group``; all share one dtype.

    Average divides by the number of members contributing (all of them unless some have
    joined). A single contiguous tensor of a dtype MPI reduces
    natively goes to MPI without a copy; anything else is packed into one fusion buffer
    (prescale folded into the pack, postscale into the unpack).
    """
    timeline = runtime.timeline
    start = timeline.now() if timeline.enabled else 0.0
    _reduce(runtime, group, pairs, op, prescale, postscale, what)
    if timeline.enabled:
        nbytes = sum(p[0].numel() * p[0].element_size() for p in pairs)
        timeline.complete(what, "communication", start, timeline.now() - start,
                          {"group": list(group), "bytes": nbytes, "tensors": len(pairs)})


def _reduce(runtime, group, pairs, op, prescale, postscale, what) -> None:
    dtype = pairs[0][0].dtype
    mpi_operation = mpi_op(op, dtype)
    red_dtype = reduction_dtype(dtype)
    total = sum(p[0].numel() for p in pairs)
    sig = signature(what, op, dtype, [p[0].shape for p in pairs])
    if pairs[0][0].is_cuda:
        # Joined ranks take part from host memory, which a GPU collective cannot mix with.
        comm, active = runtime.communicator(group, what, sig + " device=cuda")
        reduce_on_gpu(runtime, comm, group, pairs, op, active, prescale, postscale, mpi_operation)
        return
    comm, active = runtime.communicator(group, what, sig,
                                        wire=wire_format(mpi_operation, red_dtype, total))
    post = postscale / active if op is ReduceOp.AVERAGE else postscale
    if len(pairs) == 1 and prescale == 1.0 and red_dtype == dtype:
        source, target = pairs[0]
        if source.is_contiguous() and target.is_contiguous():
            _reduce_one(comm, source, target, mpi_operation, len(group))
            kernels.scale_(target, post)
            return
    buffer = runtime.queue.buffers.get(red_dtype, total)
    kernels.pack([p[0] for p in pairs], buffer, scale=prescale)
    if len(group) > 1:
        comm.Allreduce(MPI.IN_PLACE, as_buffer(buffer), op=mpi_operation)
    kernels.unpack(buffer, [p[1] for p in pairs], scale=post)


def _reduce_one(comm, source: torch.Tensor, target: torch.Tensor, operation, group_size: int):
    if group_size == 1:
        if target.data_ptr() != source.data_ptr():
            target.copy_(source)
    elif target.data_ptr() == source.data_ptr():
        comm.Allreduce(MPI.IN_PLACE, as_buffer(target), op=operation)
    else:
        comm.Allreduce(as_buffer(source), as_buffer(target), op=operation)


def wire_format(operation, dtype: torch.dtype, numel: int) -> str:
    """What a joined rank needs to take part in this all-reduce: op, dtype, element count."""
    name = next(n for n, o in _OP_NAMES.items() if o is operation or o == operation)
    return f"{name}:{str(dtype)[6:]}:{numel}"


def participate_with_identity(comm, wire: str) -> None:
    """Take part in an all-reduce described by ``wire`` contributing the op's identity."""
    name, dtype_name, numel = wire.split(":")
    dtype = getattr(torch, dtype_name)
    operation = _OP_NAMES[name]
    if name == "SUM":
        fill = 0
    elif name == "PROD":
        fill = 1
    elif dtype.is_floating_point:
        fill = float("inf") if name == "MIN" else float("-inf")
    else:
        info = torch.iinfo(dtype)
        fill = info.max if name == "MIN" else info.min
    buffer = torch.full((int(numel),), fill, dtype=dtype)
    comm.Allreduce(MPI.IN_PLACE, as_buffer(buffer), op=operation)


_OP_NAMES = {"SUM": MPI.SUM, "MIN": MPI.MIN, "MAX": MPI.MAX, "PROD": MPI.PROD}


def split_by_dtype(pairs: Sequence[Pair]) -> List[List[Pair]]:
    """Group pairs by dtype, keeping first-appearance order (deterministic on every rank)."""
    by_dtype: dict = {}
    for pair in pairs:
        by_dtype.setdefault(pair[0].dtype, []).append(pair)
    return list(by_dtype.values())
