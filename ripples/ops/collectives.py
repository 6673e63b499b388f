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

import math
import pickle
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch

from ripples import runtime as _runtime
from ripples.comm.mpi import as_buffer, mpi_op, reduction_dtype
from ripples.ops.engine import Request
from ripples.ops.handles import Handle
from ripples.ops.process_sets import ProcessSet, global_process_set
from ripples.core.reduce_ops import ReduceOp, check_op
from ripples.ops.reduction import allreduce_texts, signature


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


def _check_tensors(tensors, argument: str = "tensors") -> List[torch.Tensor]:
    if isinstance(tensors, torch.Tensor):
        raise TypeError(f"{argument} must be a list of tensors, got a single tensor")
    return [_check_tensor(t, f"{argument}[{i}]") for i, t in enumerate(tensors)]


def _group_of(process_set: ProcessSet, what: str):
    rt = _runtime.current()
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet, got {type(process_set).__name__}")
    group = process_set.group()
    if rt.rank not in group:
        raise ValueError(f"rank {rt.rank} called {what} on {process_set}, which does not "
                         "contain it; only members may call it")
    rt.left_training_step()  # a collective of the script, not a training step's P-Reduce
    return rt, group


def _names(rt, group, what: str, name: Optional[str], count: int) -> List[str]:
    """One name per tensor: ``name`` (suffixed ``.i`` for a grouped call) or automatic."""
    if name is None:
        name = rt.engine.auto_name(group, what)
    elif not isinstance(name, str):
        raise TypeError(f"name must be a str or None, got {type(name).__name__}")
    return [name] if count == 1 else [f"{name}.{i}" for i in range(count)]


def _submit(rt, requests: List[Request], handle: Handle) -> Handle:
    rt.engine.submit(requests)
    return handle


def _submit_runs(what: str, process_set, name, signatures: Sequence[str],
                 runs: Sequence[Callable], wires: Sequence[str], handle: Handle) -> Handle:
    """Submit one request per ``runs[i](comm, active)`` under ``handle``."""
    rt, group = _group_of(process_set, what)
    names = _names(rt, group, what, name, len(runs))
    requests = [Request(n, group, what, sig, handle, wire=wire, run=run)
                for n, sig, run, wire in zip(names, signatures, runs, wires)]
    return _submit(rt, requests, handle)


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
    texts = [allreduce_texts(what, op, tensor, prescale, postscale) for tensor in tensors]
    handle = Handle(what, result, parts=len(tensors))
    names = _names(rt, group, what, name, len(tensors))
    reduce = (op, prescale, postscale)
    requests = [Request(n, group, what, sig, handle, wire=wire, pair=(source, target),
                        reduce=reduce)
                for n, (sig, wire), source, target in zip(names, texts, tensors, outputs)]
    return _submit(rt, requests, handle)


def _factor(value, argument: str) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a number, got {type(value).__name__}")
    return float(value)


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
    """All-reduce ``tensor`` in place over the process set (default op: Average)."""
    return run_here(lambda: allreduce_async_(tensor, average, name, op, prescale_factor,
                                            postscale_factor, process_set))


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """All-reduce into a new tensor (default op: Average). ``compression`` as in Horovod.

    Integer tensors reduce exactly; Average and scaling factors on them are applied as in
    Horovod (product computed in float64, truncated toward zero)."""
    return _with_compression(compression, [_check_tensor(tensor)], lambda ts: [run_here(
        lambda: allreduce_async(ts[0], average, name, op, prescale_factor, postscale_factor,
                                process_set))])[0]


def _with_compression(compression, tensors, run) -> List[torch.Tensor]:
    if compression is None:
        return run(list(tensors))
    packed = [compression.compress(t) for t in tensors]
    results = run([p[0] for p in packed])
    return [compression.decompress(r, p[1]) for r, p in zip(results, packed)]


def sparse_allreduce_async(tensor, name=None, op=None, process_set=global_process_set) -> Handle:
    """Start an all-reduce of a sparse COO tensor, as Horovod does: every member's indices
    and values are all-gathered, and ``synchronize`` returns the sparse sum (divided by the
    number of members for Average; op must be Average or Sum)."""
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
    handle = grouped_allgather_async(parts, name=name, process_set=process_set)
    handle.finalize = assemble
    return handle


def run_here(start: Callable[[], Handle]):
    """A blocking collective: ``start()`` submits it, and this thread waits for it and runs
    its control round itself, so the engine thread is not woken for it (on a busy core a
    thread wake-up costs more than the round)."""
    engine = _runtime.current().engine
    with engine.waited_here():
        handle = start()
    return synchronize(handle)


def synchronize(handle: Handle):
    """Wait for an asynchronous collective and return its result (raises its error)."""
    if not isinstance(handle, Handle):
        raise TypeError(f"synchronize takes a handle from an *_async call, got {handle!r}")
    rt = _runtime.current()
    if not handle.done:
        try:
            rt.engine.wait(handle)
        except Exception as exc:
            raise rt.raised(exc, handle.generation) from exc
    if handle.error is not None:
        raise rt.raised(handle.error, handle.generation) from handle.error
    if handle.finalize is not None:
        finalize, handle.finalize = handle.finalize, None
        handle.result = finalize(handle.result)
    return handle.result


def poll(handle: Handle) -> bool:
    """True once the collective is done. Local and non-blocking: it never communicates."""
    if not isinstance(handle, Handle):
        raise TypeError(f"poll takes a handle from an *_async call, got {handle!r}")
    return handle.done


# ---------------------------------------------------------------- data movement

def _contiguous_copy(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.detach().clone(memory_format=torch.contiguous_format)


def _on_host(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor``'s values, contiguous, in host memory. Broadcast, all-gather, all-to-all
    and reduce-scatter move CUDA tensors through host memory and return results on the
    input's device, so they work with any MPI and any mix of devices across ranks (NCCL
    does only the all-reduce). Called when the operation is submitted, on the caller's
    thread: the copy then waits for the work queued on the caller's current stream."""
    tensor = tensor.detach()
    if tensor.is_cuda:
        return tensor.cpu()
    return tensor if tensor.is_contiguous() else _contiguous_copy(tensor)


def _root_index(group, root_rank, process_set, rank) -> int:
    if isinstance(root_rank, bool) or not isinstance(root_rank, int):
        raise TypeError(f"root_rank must be an int, got {type(root_rank).__name__}")
    if root_rank not in group:
        raise ValueError(f"root_rank={root_rank} is not a member of {process_set} "
                         f"(on rank {rank})")
    return group.index(root_rank)


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
    tensors = _check_tensors(tensors)
    for i, tensor in enumerate(tensors):
        if tensor.dim() == 0:
            raise ValueError(f"allgather needs tensors with at least one dimension; tensors[{i}] "
                             "is a scalar: use tensor.reshape(1)")
    handle = Handle("allgather", [None] * len(tensors), parts=len(tensors))
    sigs = [f"allgather dtype={t.dtype} row={tuple(t.shape[1:])}" for t in tensors]
    wires = [f"allgather|{str(t.dtype)[6:]}|{list(t.shape[1:])}" for t in tensors]
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


def barrier(process_set=global_process_set) -> None:
    """Return once every member has called it (bounded by ``Config.timeout_s``)."""
    handle = Handle("barrier")
    run_here(lambda: _submit_runs("barrier", process_set, None, ["barrier"],
                                  [lambda comm, active: None], [""], handle))


# ---------------------------------------------------------------- joined ranks

def allgather_as_joined(comm, wires: Sequence[str]) -> None:
    """A joined rank's part in an all-gather: it contributes no rows."""
    _, dtype_name, row = wires[0].split("|")
    row_shape = [int(x) for x in row.strip("[]").split(",") if x.strip()]
    _allgather_rows(comm, torch.empty((0, *row_shape), dtype=getattr(torch, dtype_name)))


def broadcast_as_joined(comm, wires: Sequence[str]) -> None:
    """A joined rank's part in a broadcast: it receives and discards."""
    _, dtype_name, numel, root = wires[0].split("|")
    scratch = torch.empty(int(numel), dtype=getattr(torch, dtype_name))
    comm.Bcast(as_buffer(scratch), root=int(root))
