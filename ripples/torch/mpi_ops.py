"""Differentiable collectives: Horovod's autograd rules on top of ``ripples.ops``.

Each public function here takes the arguments of the collective of the same name in
``ripples.ops`` and returns the same values. When autograd is recording (grad mode on and
an input requiring grad) the collective runs inside a ``torch.autograd.Function`` whose
backward runs the collective Horovod uses for that gradient; otherwise it is a direct call
of the plain collective, at no extra cost.

A backward is itself a collective: every member that ran the forward must run the backward
too, in the same order, as with any other collective. Backwards are differentiable again
(they call these functions), so ``create_graph=True`` works. Min, Max and Product have no
backward here (see ``allreduce``).
"""
from __future__ import annotations

from typing import Iterable, List, Sequence

import torch

from ripples import runtime as _runtime
from ripples.ops import collectives as _ops
from ripples.ops import partial as _partial
from ripples.ops.process_sets import global_process_set
from ripples.core.reduce_ops import ReduceOp, check_op

_LINEAR = (ReduceOp.AVERAGE, ReduceOp.SUM)


def _as_list(tensors):
    """``tensors`` as a list, so it can be read twice; a single tensor is left for the plain
    collective to reject."""
    return tensors if isinstance(tensors, torch.Tensor) else list(tensors)


def _records(tensors) -> bool:
    """Whether autograd must see the collective of ``tensors`` (a tensor or a list)."""
    if not torch.is_grad_enabled():
        return False
    if isinstance(tensors, torch.Tensor):
        return tensors.requires_grad
    if not isinstance(tensors, (list, tuple)):
        return False  # not a tensor (None...): the plain collective names what is wrong
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _detached(tensors) -> List[torch.Tensor]:
    """What a forward hands to the plain collective: the engine may run it on another thread,
    where grad mode is on again, so the inputs must not carry autograd history there."""
    return [t.detach() for t in tensors]


def _require_linear(op: ReduceOp, what: str) -> None:
    if op not in _LINEAR:
        raise NotImplementedError(
            f"{what} with op={op} has no gradient in ripples: the gradient of a {op} reduction "
            "is not a reduction of the incoming gradients (Horovod applies the same op to them, "
            "which is not the derivative); use op=Average or op=Sum, or detach the input")


def _compressed(compression, tensors: Sequence[torch.Tensor], run) -> List[torch.Tensor]:
    """``run`` on the compressed ``tensors``, decompressed after (both differentiable casts)."""
    if compression is None:
        return list(run(list(tensors)))
    packed = [compression.compress(t) for t in tensors]
    results = run([p[0] for p in packed])
    return [compression.decompress(r, p[1]) for r, p in zip(results, packed)]


# ---------------------------------------------------------------- all-reduce

class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, prescale, postscale, process_set, name, *tensors):
        ctx.reduction = (op, prescale, postscale, process_set)
        return tuple(_ops.grouped_allreduce(_detached(tensors), name=name, op=op,
                                            prescale_factor=prescale,
                                            postscale_factor=postscale,
                                            process_set=process_set))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.reduction
        _require_linear(op, "allreduce")
        reduced = grouped_allreduce(list(grads), op=op, prescale_factor=prescale,
                                    postscale_factor=postscale, process_set=process_set)
        return (None, None, None, None, None, *reduced)


def allreduce(tensor, average=None, name=None, compression=None, op=None, prescale_factor=1.0,
              postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """All-reduce ``tensor`` over the process set into a new tensor (default op: Average).

    Differentiable as in Horovod: the gradient of the input is the all-reduce of the
    output's gradient with the same op and the same ``prescale_factor`` and
    ``postscale_factor``, i.e. the exact gradient of the sum over members of a loss on each
    member's result. Min, Max and Product reduce forward as usual but their backward raises
    ``NotImplementedError`` (Horovod reduces the gradients with the same op, which is not
    their derivative). ``compression`` casts around the collective, also differentiably.
    """
    if not _records(tensor):
        return _ops.allreduce(tensor, average, name, compression, op, prescale_factor,
                              postscale_factor, process_set)
    return grouped_allreduce([tensor], average, name, compression, op, prescale_factor,
                             postscale_factor, process_set)[0]


def grouped_allreduce(tensors, average=None, name=None, compression=None, op=None,
                      prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set) -> List[torch.Tensor]:
    """All-reduce each of ``tensors`` (one result per input, fused where possible).

    Gradients as ``allreduce``, for all tensors in one grouped all-reduce; inputs that do
    not require grad get none, but every member still reduces every tensor's gradient.
    """
    tensors = _as_list(tensors)
    if not _records(tensors):
        return _ops.grouped_allreduce(tensors, average, name, compression, op, prescale_factor,
                                      postscale_factor, process_set)
    op = _ops.resolve_op(op, average)
    return _compressed(compression, tensors, lambda ts: _GroupedAllreduce.apply(
        op, prescale_factor, postscale_factor, process_set, name, *ts))


# ---------------------------------------------------------------- all-gather

class _GroupedAllgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, process_set, *tensors):
        gathered = _ops.grouped_allgather(_detached(tensors), name, process_set)
        ctx.rows = [t.shape[0] for t in tensors]
        ctx.process_set = process_set
        return tuple(gathered)

    @staticmethod
    def backward(ctx, *grads):
        process_set = ctx.process_set
        reduced = grouped_allreduce(list(grads), op=ReduceOp.AVERAGE, process_set=process_set)
        # Members may contribute different row counts: the offsets come from every member.
        rows = _ops.allgather(torch.tensor([ctx.rows], dtype=torch.int64),
                              process_set=process_set)
        offsets = rows[:process_set.rank()].sum(dim=0).tolist()
        return (None, None, *[g.narrow(0, start, count)
                              for g, start, count in zip(reduced, offsets, ctx.rows)])


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """Concatenate every member's ``tensor`` along dimension 0 (which may differ per member).

    Differentiable as in Horovod: the output's gradient is averaged over the members
    (all-reduce Average) and each member takes back the rows it contributed, i.e. the
    gradient of the mean over members of a loss on each member's result.
    """
    if not _records(tensor):
        return _ops.allgather(tensor, name, process_set)
    return grouped_allgather([tensor], name, process_set)[0]


def grouped_allgather(tensors, name=None, process_set=global_process_set) -> List[torch.Tensor]:
    """All-gather each of ``tensors`` (one concatenation per input); gradients as
    ``allgather``, averaged in one grouped all-reduce."""
    tensors = _as_list(tensors)
    if not _records(tensors):
        return _ops.grouped_allgather(tensors, name, process_set)
    return list(_GroupedAllgather.apply(name, process_set, *tensors))


# ---------------------------------------------------------------- broadcast, all-to-all

class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root_rank, ctx.process_set = root_rank, process_set
        return _ops.broadcast(tensor.detach(), root_rank, name, process_set)

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad, op=ReduceOp.AVERAGE, process_set=ctx.process_set)
        if _runtime.current().rank != ctx.root_rank:
            reduced = torch.zeros_like(reduced)
        return reduced, None, None, None


def broadcast(tensor, root_rank: int, name=None, process_set=global_process_set) -> torch.Tensor:
    """Return a new tensor holding ``tensor``'s value on world rank ``root_rank``.

    Differentiable as in Horovod: the root's input gets the members' average of the
    output's gradient (all-reduce Average); every other member's input gets zeros.
    """
    if not _records(tensor):
        return _ops.broadcast(tensor, root_rank, name, process_set)
    return _Broadcast.apply(tensor, root_rank, name, process_set)


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        received, received_splits = _ops.alltoall(tensor.detach(), splits, name, process_set)
        ctx.received_splits, ctx.process_set = received_splits, process_set
        ctx.mark_non_differentiable(received_splits)
        return received, received_splits

    @staticmethod
    def backward(ctx, grad, _splits_grad):
        returned, _ = alltoall(grad, splits=ctx.received_splits, process_set=ctx.process_set)
        return returned, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """All-to-all: ``splits[i]`` rows of ``tensor`` go to member ``i``. As in Horovod,
    returns ``(received, received_splits)`` when ``splits`` is given, else dimension 0 is
    divided evenly and the received tensor alone is returned.

    Differentiable as in Horovod: the gradient travels back by the reverse all-to-all,
    each member sending ``received_splits`` rows of the gradient, so every row's gradient
    returns to the member and position it came from. ``received_splits`` has no gradient.
    """
    if not _records(tensor):
        received, received_splits = _ops.alltoall(tensor, splits, name, process_set)
    else:
        received, received_splits = _Alltoall.apply(tensor, splits, name, process_set)
    return received if splits is None else (received, received_splits)


# ---------------------------------------------------------------- reduce-scatter

class _GroupedReducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, op, prescale, postscale, process_set, name, *tensors):
        ctx.reduction = (op, prescale, postscale, process_set)
        return tuple(_ops.grouped_reducescatter(_detached(tensors), name, None, op, process_set,
                                                prescale, postscale))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.reduction
        _require_linear(op, "reducescatter")
        # Horovod's scaling: the members' count for Sum (not for Average), then both factors.
        scale = prescale * postscale * (process_set.size() if op is ReduceOp.SUM else 1)
        scaled = [g * scale if scale != 1 else g for g in grads]
        return (None, None, None, None, None, *grouped_allgather(scaled, process_set=process_set))


def reducescatter(tensor, name=None, compression=None, op=None, process_set=global_process_set,
                  prescale_factor=1.0, postscale_factor=1.0) -> torch.Tensor:
    """Reduce ``tensor`` over the members, then give member ``i`` the ``i``-th slice of
    dimension 0 (the first ``dim0 % k`` of the ``k`` members get one extra row). Default op:
    Average.

    Differentiable as in Horovod: the output's gradient is multiplied by
    ``prescale_factor * postscale_factor`` (and by ``k`` for Sum) and all-gathered, so each
    input row gets the gradient of the slice it was reduced into. That is ``k`` times the
    gradient of the sum over members of a loss on each member's slice, for both ops.
    Min, Max and Product have no backward (as ``allreduce``).
    """
    if not _records(tensor):
        return _ops.reducescatter(tensor, name, compression, op, process_set, prescale_factor,
                                  postscale_factor)
    return grouped_reducescatter([tensor], name, compression, op, process_set, prescale_factor,
                                 postscale_factor)[0]


def grouped_reducescatter(tensors, name=None, compression=None, op=None,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0) -> List[torch.Tensor]:
    """Reduce-scatter each of ``tensors`` (one slice per input); gradients as
    ``reducescatter``, gathered in one grouped all-gather."""
    tensors = _as_list(tensors)
    if not _records(tensors):
        return _ops.grouped_reducescatter(tensors, name, compression, op, process_set,
                                          prescale_factor, postscale_factor)
    op = _ops.resolve_op(op, None)
    return _compressed(compression, tensors, lambda ts: _GroupedReducescatter.apply(
        op, prescale_factor, postscale_factor, process_set, name, *ts))


# ---------------------------------------------------------------- Partial All-Reduce

class _PartialAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, group, op, name):
        ctx.group, ctx.op = group, op
        return _partial.partial_allreduce(tensor.detach(), group, op, name)

    @staticmethod
    def backward(ctx, grad):
        _require_linear(ctx.op, "partial_allreduce")
        return partial_allreduce(grad, ctx.group, ctx.op), None, None, None


def partial_allreduce(tensor: torch.Tensor, group: Iterable[int], op=ReduceOp.AVERAGE,
                      name=None) -> torch.Tensor:
    """Return a new tensor: the P-Reduce of ``tensor`` over ``group`` (world ranks that
    include the caller; only they take part).

    Differentiable: the gradient of the input is the P-Reduce of the output's gradient over
    the same group with the same op (Average or Sum), the exact gradient of the sum over the
    group of a loss on each member's result; ranks outside the group take no part in it
    either. Min, Max and Product have no backward (as ``allreduce``).
    """
    if not _records(tensor):
        return _partial.partial_allreduce(tensor, group, op, name)
    # The backward needs the group again: an iterator would be spent by then.
    return _PartialAllreduce.apply(tensor, tuple(group), check_op(op), name)
