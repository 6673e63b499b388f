"""The one routine that all-reduces a list of tensors over a group of ranks.

Every agreed all-reduce run of the engine ends here: blocking and asynchronous calls,
Partial All-Reduce and the decentralized optimizer's parameter averaging.
"""
from __future__ import annotations

import functools
import math
import zlib
from typing import List, Sequence, Tuple

import torch
from mpi4py import MPI

from ripples import kernels
from ripples.comm.groups import Group
from ripples.comm.mpi import as_buffer, mpi_op, reduction_dtype
from ripples.ops.gpu import gpu_path, reduce_on_gpu
from ripples.ops.half_allreduce import HALF_DTYPES, allreduce_16bit_
from ripples.ops.ring_allreduce import PeerRing
from ripples.core.reduce_ops import ReduceOp

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


def _sent_dtype(op: ReduceOp, dtype: torch.dtype, on_device: bool) -> torch.dtype:
    if dtype in HALF_DTYPES and not on_device and op in _16BIT_OPS:
        return dtype
    return reduction_dtype(dtype)


_16BIT_OPS = (ReduceOp.SUM, ReduceOp.AVERAGE)


def allreduce_texts(what: str, op: ReduceOp, tensor: torch.Tensor, prescale: float,
                    postscale: float, gpu_setting: str = "auto") -> Tuple[str, str]:
    """The signature and the wire text (``allreduce_wire``) of an all-reduce request of
    ``tensor``, computed once per call shape, so that a blocking all-reduce in a loop pays
    one dictionary lookup for both. ``gpu_setting`` is ``Config.gpu_path``. Raises
    ValueError when ``op`` is not defined on the dtype (e.g. Average on bool)."""
    path = gpu_path(gpu_setting) if tensor.is_cuda else None
    return _allreduce_texts(what, op, tensor.dtype, tensor.shape, path, prescale, postscale)


def allreduce_wire(what: str, op: ReduceOp, tensor: torch.Tensor, prescale: float,
                   postscale: float, gpu_setting: str = "auto") -> str:
    """The wire text of an all-reduce request: its fusion key, then what a joined rank needs
    to take part (MPI op, the dtype sent, element count) and its size for chunking. A
    16-bit dtype sent means the 16-bit sum (``allreduce_16bit_``) instead of MPI's."""
    return allreduce_texts(what, op, tensor, prescale, postscale, gpu_setting)[1]


@functools.lru_cache(maxsize=4096)  # training repeats the same few calls every step
def _allreduce_texts(what, op, dtype, shape, path, prescale, postscale) -> Tuple[str, str]:
    """``path``: the ``gpu_path`` of a CUDA tensor, None for a host tensor."""
    operation = next(n for n, o in _OP_NAMES.items() if o == mpi_op(op, dtype))
    numel = math.prod(shape)
    is_cuda = path is not None
    # Members must reduce device tensors the same way (NCCL, CUDA-aware MPI or the host):
    # the path is part of the signature, so a member without NCCL is a mismatch, not a hang.
    device = f"cuda/{path}" if is_cuda else "cpu"
    key = f"{what}:{str(dtype)[6:]}:{op}:{prescale!r}:{postscale!r}:{device}"
    sent = str(_sent_dtype(op, dtype, is_cuda and path != "host"))[6:]
    wire = f"allreduce|{key}|{operation}|{sent}|{numel}|{numel * dtype.itemsize}"
    sig = f"{signature(what, op, dtype, [shape])} pre={prescale!r} post={postscale!r}"
    if is_cuda:
        sig += f" on {device}"
    return sig, wire


def reduce_pairs(runtime, comm, group: Group, active: int, pairs: Sequence[Pair], op: ReduceOp,
                 prescale: float = 1.0, postscale: float = 1.0) -> None:
    """All-reduce ``pairs`` (inputs into outputs, one dtype) over ``group``'s communicator
    ``comm``, once the members have agreed to (the engine calls this).

    Average divides by ``active``, the members contributing (all of them unless some have
    joined), or with ``Config.horovod_join`` by all members, as Horovod. A single
    contiguous tensor of a dtype MPI reduces natively goes to MPI without a copy; anything
    else is packed into one fusion buffer (prescale folded into the pack,
    postscale into the unpack). Host float16/bfloat16 Sum and Average are packed into a
    16-bit buffer and summed by ``allreduce_16bit_`` (2 bytes per element on the wire,
    float32 accumulation); other 16-bit reductions run in a float32 buffer. ``comm`` may
    be a group's ``PeerRing`` instead (``Config.group_allreduce``): host tensors are then
    packed into one buffer in the reduction dtype and reduced around the ring. Integer tensors
    are scaled as Horovod does: the product in float64, truncated toward zero.
    """
    dtype = pairs[0][0].dtype
    mpi_operation = mpi_op(op, dtype)
    divisor = len(group) if runtime.config.horovod_join else active
    post = postscale / divisor if op is ReduceOp.AVERAGE else postscale
    if pairs[0][0].is_cuda:
        if gpu_path(runtime.config.gpu_path) == "host":
            _reduce_through_host(runtime, comm, group, active, pairs, op, prescale, postscale)
        else:
            reduce_on_gpu(runtime, comm, group, pairs, op, active, prescale, postscale,
                          mpi_operation)
        return
    if isinstance(comm, PeerRing):
        _reduce_over_ring(runtime, comm, pairs, mpi_operation, prescale, post)
        return
    if not (dtype.is_floating_point or dtype is torch.bool):
        _reduce_integers(runtime, comm, len(group), pairs, mpi_operation, prescale, post)
        return
    red_dtype = dtype
    if dtype in HALF_DTYPES:  # as _sent_dtype says, for host tensors
        if op in _16BIT_OPS:
            _reduce_16bit(runtime, comm, len(group), pairs, prescale, post)
            return
        red_dtype = torch.float32
    if len(pairs) == 1 and prescale == 1.0 and red_dtype == dtype:
        source, target = pairs[0]
        if source.is_contiguous() and target.is_contiguous():
            _reduce_one(comm, source, target, mpi_operation, len(group))
            kernels.scale_(target, post)
            return
    total = sum(p[0].numel() for p in pairs)
    buffer = runtime.buffers.get(red_dtype, total)
    kernels.pack([p[0] for p in pairs], buffer, scale=prescale)
    if len(group) > 1:
        comm.Allreduce(MPI.IN_PLACE, as_buffer(buffer), op=mpi_operation)
    kernels.unpack(buffer, [p[1] for p in pairs], scale=post)


def reduce_requests(runtime, comm, group: Group, active: int, requests) -> None:
    """Reduce one fused run of agreed all-reduce requests (same dtype, op and scaling)."""
    op, prescale, postscale = requests[0].reduce
    reduce_pairs(runtime, comm, group, active, [r.pair for r in requests], op, prescale,
                 postscale)


def _reduce_over_ring(runtime, ring: PeerRing, pairs: Sequence[Pair], operation, prescale,
                      post) -> None:
    """The host reduction of ``pairs`` over a group's point-to-point ring: one buffer in the
    reduction dtype (float32 for 16-bit floats, so partial sums keep full precision), with
    integers scaled as in ``_reduce_integers``."""
    dtype = pairs[0][0].dtype
    integer = not (dtype.is_floating_point or dtype is torch.bool)
    sources = [p[0] if prescale == 1.0 or not integer else _scaled_integers(p[0], prescale)
               for p in pairs]
    targets = [p[1] for p in pairs]
    buffer = runtime.buffers.get(reduction_dtype(dtype), sum(s.numel() for s in sources))
    kernels.pack(sources, buffer, scale=1.0 if integer else prescale)
    ring.allreduce_(buffer, operation)
    kernels.unpack(buffer, targets, scale=1.0 if integer else post)
    if integer and post != 1.0:
        for target in targets:
            target.copy_(_scaled_integers(target, post))


def _reduce_one(comm, source: torch.Tensor, target: torch.Tensor, operation, group_size: int):
    if group_size == 1:
        if target.data_ptr() != source.data_ptr():
            target.copy_(source)
    elif target.data_ptr() == source.data_ptr():
        comm.Allreduce(MPI.IN_PLACE, as_buffer(target), op=operation)
    else:
        comm.Allreduce(as_buffer(source), as_buffer(target), op=operation)


def _reduce_16bit(runtime, comm, group_size, pairs, prescale, post) -> None:
    source, target = pairs[0]
    direct = len(pairs) == 1 and prescale == 1.0 and target.is_contiguous()
    if direct:  # summed where the result goes: no fusion buffer
        buffer = target.view(-1)
        if buffer.data_ptr() != source.data_ptr():
            buffer.copy_(source.reshape(-1))
    else:
        buffer = runtime.buffers.get(source.dtype, sum(p[0].numel() for p in pairs))
        kernels.pack([p[0] for p in pairs], buffer, scale=prescale)
    if group_size > 1:
        allreduce_16bit_(comm, buffer)
    if direct:
        kernels.scale_(buffer, post)
    else:
        kernels.unpack(buffer, [p[1] for p in pairs], scale=post)


def _reduce_integers(runtime, comm, group_size, pairs, operation, prescale, post) -> None:
    # One MPI call for the whole run, like the float path: a joined rank contributes one
    # fused buffer of the same length (participate_with_identity).
    sources = [p[0] if prescale == 1.0 else _scaled_integers(p[0], prescale) for p in pairs]
    targets = [p[1] for p in pairs]
    source, target = sources[0], targets[0]
    if len(pairs) == 1 and source.is_contiguous() and target.is_contiguous():
        _reduce_one(comm, source, target, operation, group_size)
    else:
        buffer = runtime.buffers.get(source.dtype, sum(s.numel() for s in sources))
        kernels.pack(sources, buffer)
        if group_size > 1:
            comm.Allreduce(MPI.IN_PLACE, as_buffer(buffer), op=operation)
        kernels.unpack(buffer, targets)
    if post != 1.0:
        for target in targets:
            target.copy_(_scaled_integers(target, post))


def _reduce_through_host(runtime, comm, group: Group, active: int, pairs: Sequence[Pair],
                         op: ReduceOp, prescale: float, postscale: float) -> None:
    """The host path for CUDA ``pairs`` (``gpu_path`` "host"): copies to host memory (each
    waits for the work queued on the current stream), the host reduction, copies back."""
    staged = [source.detach().to("cpu") for source, _ in pairs]
    reduce_pairs(runtime, comm, group, active, [(t, t) for t in staged], op, prescale,
                 postscale)
    for (_, target), result in zip(pairs, staged):
        target.copy_(result)


def _scaled_integers(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    return (tensor.to(torch.float64) * factor).trunc().to(tensor.dtype)


def participate_with_identity(comm, wires: Sequence[str], nccl=None) -> None:
    """Take part in one fused all-reduce of the requests described by ``wires`` (see
    ``allreduce_wire``), contributing the op's identity: what a joined rank does.

    ``comm`` is the world's communicator; ``nccl`` (the runtime's ``NcclCache``) carries
    the share of an all-reduce the active ranks run over NCCL, on this rank's current GPU.
    """
    fields = [w.split("|") for w in wires]
    name, dtype_name = fields[0][2], fields[0][3]
    numel = sum(int(f[4]) for f in fields)
    key = fields[0][1].split(":")
    if key[-1] == "cuda/nccl":  # NCCL reduces the tensors' own dtype
        dtype_name = key[1]
    dtype = getattr(torch, dtype_name)
    operation = _OP_NAMES[name]
    if dtype is torch.bool:  # bool travels as uint8 under MAX (or) or MIN (and)
        fill = name == "MIN"
    elif name == "SUM":
        fill = 0
    elif name == "PROD":
        fill = 1
    elif dtype.is_floating_point:
        fill = float("inf") if name == "MIN" else float("-inf")
    else:
        info = torch.iinfo(dtype)
        fill = info.max if name == "MIN" else info.min
    if key[-1] == "cuda/nccl":
        device = torch.device("cuda", torch.cuda.current_device())
        buffer = torch.full((int(numel),), fill, dtype=dtype, device=device)
        wire = buffer.view(torch.uint8) if dtype is torch.bool else buffer
        group = tuple(range(comm.Get_size()))
        nccl.get(group, comm, device).allreduce(wire, wire, name.lower())
        return
    buffer = torch.full((int(numel),), fill, dtype=dtype)
    if dtype in HALF_DTYPES:
        allreduce_16bit_(comm, buffer)
    else:
        comm.Allreduce(MPI.IN_PLACE, as_buffer(buffer), op=operation)


_OP_NAMES = {"SUM": MPI.SUM, "MIN": MPI.MIN, "MAX": MPI.MAX, "PROD": MPI.PROD}


def split_by_dtype(pairs: Sequence[Pair]) -> List[List[Pair]]:
    """Group pairs by dtype, keeping first-appearance order (deterministic on every rank)."""
    by_dtype: dict = {}
    for pair in pairs:
        by_dtype.setdefault(pair[0].dtype, []).append(pair)
    return list(by_dtype.values())
