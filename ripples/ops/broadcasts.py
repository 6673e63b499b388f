"""Broadcasts (tensors and picklable objects), the object all-gather, and the barrier.

The contract is that of ``ripples.ops.collectives``: named, matched by name over the
process set, mismatches raise ``MismatchError`` and absent members a timeout.
"""
from __future__ import annotations

import pickle
from typing import Sequence

import torch

from ripples.comm.mpi import as_buffer
from ripples.ops.handles import Handle
from ripples.ops.process_sets import global_process_set
from ripples.ops.submission import (_check_tensor, _contiguous_copy, _group_of, _on_host,
                                    _root_index, _submit_runs, run_here)


def broadcast_async_(tensor, root_rank: int, name=None,
                     process_set=global_process_set) -> Handle:
    """Start overwriting ``tensor`` on every member with its value on world rank
    ``root_rank``; ``synchronize`` returns ``tensor``."""
    tensor = _check_tensor(tensor)
    rt, group = _group_of(process_set, "broadcast")
    root = _root_index(group, root_rank, process_set, rt.rank)

    target = _on_host(tensor)

    def run(comm, active):
        if len(group) == 1:
            return
        comm.Bcast(as_buffer(target), root=root)
        if target.data_ptr() != tensor.data_ptr():
            tensor.copy_(target)

    sig = f"broadcast root={root_rank} dtype={tensor.dtype} shape={tuple(tensor.shape)}"
    wire = f"broadcast|{str(tensor.dtype)[6:]}|{tensor.numel()}|{root}"
    if rt.config.horovod_join:  # an empty wire: refused after a join
        wire = ""
    return _submit_runs("broadcast", process_set, name, [sig], [run], [wire],
                        Handle("broadcast", tensor))


def broadcast_async(tensor, root_rank: int, name=None, process_set=global_process_set) -> Handle:
    """Start a broadcast into a new tensor (returned by ``synchronize``)."""
    return broadcast_async_(_contiguous_copy(_check_tensor(tensor)), root_rank, name,
                            process_set)


def broadcast_(tensor, root_rank: int, name=None, process_set=global_process_set) -> torch.Tensor:
    """Overwrite ``tensor`` on every member with its value on world rank ``root_rank``."""
    return run_here(lambda: broadcast_async_(tensor, root_rank, name, process_set))


def broadcast(tensor, root_rank: int, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return a new tensor holding ``tensor``'s value on world rank ``root_rank``."""
    return run_here(lambda: broadcast_async(tensor, root_rank, name, process_set))


def _object_collective(what, process_set, name, sig, body):
    handle = Handle(what)

    def run(comm, active):
        handle.result = body(comm)

    return run_here(lambda: _submit_runs(what, process_set, name, [sig], [run], [""], handle))


def broadcast_object(obj, root_rank: int = 0, name=None, process_set=global_process_set):
    """Return the picklable ``obj`` of world rank ``root_rank`` on every member."""
    rt, group = _group_of(process_set, "broadcast_object")
    root = _root_index(group, root_rank, process_set, rt.rank)
    return _object_collective("broadcast_object", process_set, name,
                              f"broadcast_object root={root_rank}",
                              lambda comm: obj if comm is None else comm.bcast(obj, root=root))


def allgather_object(obj, name=None, process_set=global_process_set) -> list:
    """Every member's picklable ``obj``, in rank order."""
    pickle.dumps(obj)  # an unpicklable object fails here, on its own rank, before any wait
    return _object_collective("allgather_object", process_set, name, "allgather_object",
                              lambda comm: [obj] if comm is None else comm.allgather(obj))


def barrier(process_set=global_process_set) -> None:
    """Return once every member has called it (bounded by ``Config.timeout_s``)."""
    handle = Handle("barrier")
    run_here(lambda: _submit_runs("barrier", process_set, None, ["barrier"],
                                  [lambda comm, active: None], [""], handle))


def broadcast_as_joined(comm, wires: Sequence[str]) -> None:
    """A joined rank's part in a broadcast: it receives and discards."""
    _, dtype_name, numel, root = wires[0].split("|")
    scratch = torch.empty(int(numel), dtype=getattr(torch, dtype_name))
    comm.Bcast(as_buffer(scratch), root=int(root))
