"""What every collective does at the call: argument checks, names, submission, waiting.

Shared by the collective families (``collectives``, ``broadcasts``, ``gathers``,
``reducescatter``, ``partial``); see ``ripples.ops.collectives`` for the contract.
"""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from ripples import runtime as _runtime
from ripples.core.reduce_ops import ReduceOp, check_op
from ripples.ops.handles import Handle
from ripples.ops.process_sets import ProcessSet
from ripples.ops.request import Request


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
    rt.before_script_collective(group)
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


def _factor(value, argument: str) -> float:
    if type(value) is float:
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{argument} must be a number, got {type(value).__name__}")
    return float(value)


def _with_compression(compression, tensors, run) -> List[torch.Tensor]:
    if compression is None:
        return run(list(tensors))
    packed = [compression.compress(t) for t in tensors]
    results = run([p[0] for p in packed])
    return [compression.decompress(r, p[1]) for r, p in zip(results, packed)]


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
