"""The all-reduce path for CUDA tensors (``Config.gpu_path``): NCCL, or CUDA-aware MPI; the
third path, staging through host memory, is the host reduction's (``ops.reduction``).

A group's NCCL communicator is bootstrapped over the group's MPI communicator (its rank 0
makes the unique id) and lives exactly as long as that MPI communicator: members rebuild
both together, so they always agree on it. Work is enqueued on torch's current stream.
The GPU tests (``benchmarks/gpu_check.sh``) run it on a GPU; CI machines have none.
"""
from __future__ import annotations

import functools

import torch
from mpi4py import MPI

from ripples import kernels
from ripples.core.reduce_ops import ReduceOp

_NCCL_OPS = {ReduceOp.SUM: "sum", ReduceOp.AVERAGE: "sum", ReduceOp.MIN: "min",
             ReduceOp.MAX: "max", ReduceOp.PRODUCT: "prod"}
# bool travels as uint8 0/1, as on the host: "sum" is logical or, "product" logical and
# (NCCL's sum of uint8 could wrap past 255, and its backend rejects bool sums).
_NCCL_BOOL_OPS = {ReduceOp.SUM: "max", ReduceOp.MAX: "max", ReduceOp.MIN: "min",
                  ReduceOp.PRODUCT: "min"}


def gpu_path(setting: str = "auto") -> str:
    """How this rank reduces CUDA tensors under ``Config.gpu_path`` ``setting``: ``"nccl"``,
    ``"mpi"`` (CUDA-aware MPI) or ``"host"`` (staged through host memory); ``"auto"`` is
    NCCL where cupy with NCCL imports, else the host. Part of every CUDA all-reduce's
    signature, so members that would take different paths (one lacks cupy) get
    ``MismatchError`` instead of waiting on each other for good."""
    if setting != "auto":
        return setting
    return _automatic_gpu_path()


@functools.lru_cache(maxsize=1)  # asked on every CUDA all-reduce; cupy's import is stable
def _automatic_gpu_path() -> str:
    from ripples.comm.nccl import nccl_available
    return "nccl" if nccl_available() else "host"


def nccl_operation(op: ReduceOp, dtype: torch.dtype, active: int, members: int) -> str:
    """The NCCL op for ``op`` on ``dtype``: "avg" when every member contributes to an
    Average (NCCL divides in the same pass), the host's bool mapping for bool tensors."""
    if dtype is torch.bool:
        return _NCCL_BOOL_OPS[op]
    if op is ReduceOp.AVERAGE and active == members:
        return "avg"
    return _NCCL_OPS[op]


class NcclCache:
    """NCCL communicators keyed by group, each tied to the MPI communicator it came from
    and built on the device of the first tensor that needed it. With a ``watchdog``
    (``ripples.comm.nccl_watchdog``), every operation on them is bounded by its timeout."""

    def __init__(self, watchdog=None):
        self._entries: dict = {}
        self.watchdog = watchdog

    def get(self, group, mpi_comm, device: torch.device):
        """``group``'s NCCL communicator on ``device`` (built over ``mpi_comm``, collective
        over its members, the first time). Raises ValueError when the group's communicator
        is on another device: each rank must keep its tensors of a group on one GPU."""
        from ripples.comm.nccl import NcclCommunicator
        entry = self._entries.get(group)
        if entry is not None and entry[0] is mpi_comm:
            if entry[1].device != device:
                raise ValueError(
                    f"a CUDA collective on group {group} got a tensor on {device}, but this "
                    f"rank's NCCL communicator of the group is on {entry[1].device}: keep "
                    "each rank's tensors on one GPU (torch.cuda.set_device(local_rank))")
            return entry[1]
        self.drop(group)
        nccl = NcclCommunicator.from_mpi(mpi_comm, device=device, watchdog=self.watchdog,
                                         label=f"group {tuple(group)}")
        self._entries[group] = (mpi_comm, nccl)
        return nccl

    def drop(self, group) -> None:
        entry = self._entries.pop(group, None)
        if entry is not None:
            entry[1].close()

    def close(self) -> None:
        for group in list(self._entries):
            self.drop(group)
        if self.watchdog is not None:
            self.watchdog.close()


def reduce_on_gpu(runtime, comm, group, pairs, op: ReduceOp, active: int, prescale: float,
                  postscale: float, mpi_operation) -> None:
    """All-reduce CUDA ``pairs`` (inputs into outputs) over ``group``, one fused buffer,
    by NCCL or CUDA-aware MPI (``gpu_path``; the host path is ``reduction``'s)."""
    source = pairs[0][0]
    total = sum(p[0].numel() for p in pairs)
    single = len(pairs) == 1 and prescale == 1.0 and all(t.is_contiguous() for t in pairs[0])
    if single:
        buffer = pairs[0][1]
        if buffer.data_ptr() != source.data_ptr():
            buffer.copy_(source)
    else:
        buffer = runtime.buffers.get(source.dtype, total, device=source.device)
        kernels.pack([p[0] for p in pairs], buffer, scale=prescale)
    divisor = len(group) if runtime.config.horovod_join else active  # as reduce_pairs
    post = postscale / divisor if op is ReduceOp.AVERAGE else postscale
    if len(group) > 1:
        if gpu_path(runtime.config.gpu_path) == "nccl":
            nccl_op = nccl_operation(op, source.dtype, active, len(group))
            if nccl_op == "avg":
                post = postscale  # NCCL averaged in the same pass
            wire = buffer.view(torch.uint8) if source.dtype is torch.bool else buffer
            runtime.nccl.get(group, comm, source.device).allreduce(wire, wire, nccl_op)
        else:
            _allreduce_with_cuda_aware_mpi(comm, buffer, mpi_operation)
    if single:
        kernels.scale_(buffer, post)
    else:
        kernels.unpack(buffer, [p[1] for p in pairs], scale=post)


def _allreduce_with_cuda_aware_mpi(comm, buffer: torch.Tensor, mpi_operation) -> None:
    """MPI reads device memory through ``__cuda_array_interface__``, outside torch's
    streams: the work queued on the buffer must be finished first. MPI has no bfloat16
    (and no reliable float16 reduction): those are reduced in a float32 copy, and bool
    as uint8."""
    torch.cuda.current_stream(buffer.device).synchronize()
    if buffer.dtype in (torch.float16, torch.bfloat16):
        wide = buffer.float()
        torch.cuda.current_stream(buffer.device).synchronize()
        comm.Allreduce(MPI.IN_PLACE, wide, op=mpi_operation)
        buffer.copy_(wide)
    else:
        wire = buffer.view(torch.uint8) if buffer.dtype is torch.bool else buffer
        comm.Allreduce(MPI.IN_PLACE, wire, op=mpi_operation)
