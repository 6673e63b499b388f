"""The all-reduce path for CUDA tensors: NCCL when available, else CUDA-aware MPI.

A group's NCCL communicator is bootstrapped over the group's MPI communicator (its rank 0
makes the unique id) and lives exactly as long as that MPI communicator: members rebuild
both together, so they always agree on it. Work is enqueued on torch's current stream.
Not exercised on these machines (no GPU); the GPU tests run it where a GPU exists.
"""
from __future__ import annotations

from mpi4py import MPI

from ripples import kernels
from ripples.reduce_ops import ReduceOp

_NCCL_OPS = {ReduceOp.SUM: "sum", ReduceOp.AVERAGE: "sum", ReduceOp.MIN: "min",
             ReduceOp.MAX: "max", ReduceOp.PRODUCT: "prod"}


class NcclCache:
    """NCCL communicators keyed by group, each tied to the MPI communicator it came from."""

    def __init__(self):
        self._entries: dict = {}

    def get(self, group, mpi_comm):
        from ripples.comm.nccl import NcclCommunicator
        entry = self._entries.get(group)
        if entry is not None and entry[0] is mpi_comm:
            return entry[1]
        self.drop(group)
        nccl = NcclCommunicator.from_mpi(mpi_comm)
        self._entries[group] = (mpi_comm, nccl)
        return nccl

    def drop(self, group) -> None:
        entry = self._entries.pop(group, None)
        if entry is not None:
            entry[1].close()

    def close(self) -> None:
        for group in list(self._entries):
            self.drop(group)


def reduce_on_gpu(runtime, comm, group, pairs, op: ReduceOp, active: int, prescale: float,
                  postscale: float, mpi_operation) -> None:
    """All-reduce CUDA ``pairs`` (inputs into outputs) over ``group``: one fused buffer."""
    from ripples.comm.nccl import nccl_available
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
    post = postscale / active if op is ReduceOp.AVERAGE else postscale
    if len(group) > 1:
        if nccl_available():
            nccl_op = _NCCL_OPS[op]
            if op is ReduceOp.AVERAGE and active == len(group):
                nccl_op, post = "avg", postscale  # NCCL averages in the same pass
            runtime.nccl.get(group, comm).allreduce(buffer, buffer, nccl_op)
        else:  # CUDA-aware MPI reads device memory through __cuda_array_interface__
            comm.Allreduce(MPI.IN_PLACE, buffer, op=mpi_operation)
    if single:
        kernels.scale_(buffer, post)
    else:
        kernels.unpack(buffer, [p[1] for p in pairs], scale=post)
