"""All-gather (rows of different counts per member) and all-to-all.

The contract is that of ``ripples.ops.collectives``. Device tensors travel through host
memory and come back on their device.
"""
from __future__ import annotations

import math
from typing import List, Sequence

import numpy as np
import torch

from ripples import runtime as _runtime
from ripples.comm.mpi import as_buffer
from ripples.ops.handles import Handle
from ripples.ops.process_sets import global_process_set
from ripples.ops.submission import (_check_tensor, _check_tensors, _contiguous_copy, _group_of,
                                    _on_host, _submit_runs, run_here)


def _allgather_rows(comm, source: torch.Tensor) -> torch.Tensor:
    """All-gather contiguous ``source`` along dimension 0 over ``comm``, where members may
    have different numbers of rows: the counts first, then the rows."""
    gathered = np.empty(comm.Get_size(), dtype=np.int64)
    comm.Allgather(np.array([source.shape[0]], dtype=np.int64), gathered)
    rows = gathered.tolist()
    output = torch.empty((sum(rows), *source.shape[1:]), dtype=source.dtype)
    row_numel = math.prod(source.shape[1:])
    comm.Allgatherv(as_buffer(source), [as_buffer(output), [r * row_numel for r in rows]])
    return output


def _allgather_run(tensor, handle, index):
    source = _on_host(tensor)

    def run(comm, active):
        if comm is None:
            output = _contiguous_copy(tensor)
        else:
            output = _allgather_rows(comm, source).to(tensor.device)
        if index is None:
            handle.result = output
        else:
            handle.result[index] = output

    return run


def grouped_allgather_async(tensors, name=None, process_set=global_process_set) -> Handle:
    """Start all-gathers of ``tensors`` (each along dimension 0, which may differ per
    member); ``synchronize`` returns the list of gathered tensors."""
    return start_allgathers(tensors, name, process_set, Handle)


def start_allgathers(tensors, name, process_set, handle_type) -> Handle:
    """``grouped_allgather_async`` with a handle of ``handle_type`` (a ``Handle`` class)."""
    tensors = _check_tensors(tensors)
    for i, tensor in enumerate(tensors):
        if tensor.dim() == 0:
            raise ValueError(f"allgather needs tensors with at least one dimension; tensors[{i}] "
                             "is a scalar: use tensor.reshape(1)")
    handle = handle_type("allgather", [None] * len(tensors), parts=len(tensors))
    sigs = [f"allgather dtype={t.dtype} row={tuple(t.shape[1:])}" for t in tensors]
    wires = [f"allgather|{str(t.dtype)[6:]}|{list(t.shape[1:])}" for t in tensors]
    if _runtime.current().config.horovod_join:  # an empty wire: refused after a join
        wires = [""] * len(wires)
    runs = [_allgather_run(t, handle, i) for i, t in enumerate(tensors)]
    return _submit_runs("allgather", process_set, name, sigs, runs, wires, handle)


def allgather_async(tensor, name=None, process_set=global_process_set) -> Handle:
    """Start an all-gather of ``tensor`` along dimension 0 (``synchronize`` returns it)."""
    handle = grouped_allgather_async([_check_tensor(tensor)], name, process_set)
    handle.finalize = lambda results: results[0]
    return handle


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> List[torch.Tensor]:
    return run_here(lambda: grouped_allgather_async(tensors, name, process_set))


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenate every member's ``tensor`` along dimension 0 (which may differ per rank)."""
    return run_here(lambda: allgather_async(tensor, name, process_set))


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> Handle:
    """Start an all-to-all: ``splits[i]`` rows of ``tensor`` (in order) go to member ``i``;
    ``synchronize`` returns ``(received, received_splits)``. Without ``splits`` dimension 0
    is divided evenly."""
    tensor = _check_tensor(tensor)
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
    source = _on_host(tensor)
    handle = Handle("alltoall")

    def run(comm, active):
        if comm is None:
            handle.result = (_contiguous_copy(tensor), torch.tensor(splits, dtype=torch.int32))
            return
        row_numel = math.prod(source.shape[1:])
        received = np.empty(k, dtype=np.int64)
        comm.Alltoall(np.array(splits, dtype=np.int64), received)
        output = torch.empty((int(received.sum()), *source.shape[1:]), dtype=source.dtype)
        comm.Alltoallv([as_buffer(source), [s * row_numel for s in splits]],
                       [as_buffer(output), (received * row_numel).tolist()])
        handle.result = (output.to(tensor.device), torch.from_numpy(received.astype(np.int32)))

    sig = f"alltoall dtype={tensor.dtype} row={tuple(tensor.shape[1:])}"
    return _submit_runs("alltoall", process_set, name, [sig], [run], [""], handle)


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """All-to-all (see ``alltoall_async``); returns ``(received, received_splits)``."""
    return run_here(lambda: alltoall_async(tensor, splits, name, process_set))


def allgather_as_joined(comm, wires: Sequence[str]) -> None:
    """A joined rank's part in an all-gather: it contributes no rows."""
    _, dtype_name, row = wires[0].split("|")
    row_shape = [int(x) for x in row.strip("[]").split(",") if x.strip()]
    _allgather_rows(comm, torch.empty((0, *row_shape), dtype=getattr(torch, dtype_name)))
