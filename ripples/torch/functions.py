"""Model-level helpers: broadcast at start, average at the end, measure consensus."""
from __future__ import annotations

from typing import Iterable, Mapping, Union

import torch

from ripples import runtime as _runtime
from ripples.ops.collectives import broadcast_, broadcast_object, grouped_allreduce_
from ripples.core.errors import RanksFailedError
from ripples.core.reduce_ops import ReduceOp
from ripples.ops.join import join
from ripples.ops.reduction import split_by_dtype
from ripples.torch.optimizer_base import WrappedOptimizer
from ripples.torch.ownership import serving
from ripples.torch.snapshot import Snapshot


def _tensors_of(params: Union[Mapping, Iterable]) -> list:
    items = params.items() if isinstance(params, Mapping) else params
    tensors = []
    for item in items:
        tensor = item[1] if isinstance(item, tuple) else item
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"params must hold tensors (a state_dict or named_parameters), got "
                            f"{type(tensor).__name__}")
        tensors.append(tensor)
    return tensors


def broadcast_parameters(params, root_rank: int) -> None:
    """Overwrite ``params`` (``model.state_dict()`` or ``model.named_parameters()``) on every
    rank with their values on ``root_rank``."""
    with torch.no_grad():
        for tensor in _tensors_of(params):
            broadcast_(tensor.data, root_rank)


def broadcast_optimizer_state(optimizer, root_rank: int) -> None:
    """Give every rank the optimizer state (momentum, step counts) of ``root_rank``.

    For a ``DistributedOptimizer`` that includes its own counters (the steps and syncs a
    ``state_dict()`` saves under ``"ripples"``), as if every rank had loaded the root's
    checkpoint: a script that loads a checkpoint on the root only and then broadcasts
    resumes every rank at the root's step, which the static and random schedules need to
    give every rank the same groups.

    While the root's optimizer has no state yet (no step taken), every parameter that
    requires a gradient and has none gets a zero gradient, as Horovod leaves them; frozen
    parameters keep ``grad`` None. Horovod also takes an optimizer step on those zero
    gradients to create the state; ripples does not (it would apply weight decay to the
    parameters), and the state stays empty until the first real step.
    """
    inner = getattr(optimizer, "optimizer", optimizer)
    wrapper = optimizer if isinstance(optimizer, WrappedOptimizer) else None
    extra = wrapper.extra_state() if wrapper is not None else None
    state, extra = broadcast_object((inner.state_dict(), extra), root_rank)
    if wrapper is not None:
        wrapper.check_extra_state(extra)  # settings this rank cannot take: nothing loaded
    inner.load_state_dict(state)
    if wrapper is not None and _runtime.current().rank != root_rank:
        wrapper.load_extra_state(extra)
    if not state["state"]:
        for group in inner.param_groups:
            for param in group["params"]:
                if param.requires_grad and param.grad is None:
                    param.grad = torch.zeros_like(param)


def average_model(model: torch.nn.Module) -> torch.nn.Module:
    """Replace parameters and floating buffers on every rank by their average over all ranks
    (one fused all-reduce per dtype): every mode ends with one model to evaluate and save.

    Collective. In decentralized modes (``sync="ripples"``, ``"adpsgd"``) each rank holds
    its own replica between averagings: call this on every rank before evaluating or
    saving the model the job trained (it also tells the optimizer that the replicas are
    equal, which silences its warning on ``model.state_dict()``).

    Under an optimizer that lets ranks take different numbers of steps (those modes, and
    ``hvd.DistributedSampler``'s shared epoch) it first joins (``hvd.join()``): a rank that
    gets here early takes part, without data, in the collectives the others still run in
    their last steps (a metric all-reduced every batch), so those pair up and the averaging
    starts once every rank has left its loop.

    Under ``fault_tolerant`` a rank that dies (or is cut off) during the averaging does not
    end it: the survivors put back their own tensors and average them among themselves, so
    the call returns one model on every survivor instead of raising
    ``HorovodInternalError``. Each retry runs on a smaller world, so it ends."""
    rt = _runtime.current()
    if rt.uneven_steps:
        join()
    tensors = [p.data for p in model.parameters()]
    tensors += [b for b in model.buffers() if b.dtype.is_floating_point]
    snapshot = Snapshot() if rt.config.fault_tolerant else None
    while True:
        if snapshot is not None:
            snapshot.save(tensors)
        try:
            with torch.no_grad():
                for group in split_by_dtype([(t, t) for t in tensors]):
                    grouped_allreduce_([t for t, _ in group], op=ReduceOp.AVERAGE)
            break
        except RanksFailedError:
            if snapshot is None:
                raise
            # The survivors are on a smaller world now (a rank on the losing side of a
            # partition never returns here): average this rank's own model among them.
            snapshot.restore(tensors)
    for param in model.parameters():
        replicas = getattr(serving(param), "replicas", None)
        if replicas is not None:
            replicas.averaged()
    return model


def consensus_distance(model: torch.nn.Module) -> float:
    """``mean_i ||x_i - x_mean||^2`` over ranks, from one all-reduce of the parameters and
    their squared norm. Collective: every rank must call it at the same point."""
    flat = torch.cat([p.detach().reshape(-1).double() for p in model.parameters()])
    packed = torch.cat([flat, (flat * flat).sum().reshape(1)])
    grouped_allreduce_([packed], op=ReduceOp.AVERAGE)
    mean, mean_sq_norm = packed[:-1], packed[-1]
    return max(0.0, float(mean_sq_norm - (mean * mean).sum()))
