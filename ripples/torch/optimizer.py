"""``DistributedOptimizer``: Horovod's wrapper, plus decentralized and parameter-server modes.

This module checks the arguments and picks the mode; each mode lives in its own module:

- ``sync="allreduce"`` (default, ``allreduce_optimizer``): Horovod. Gradients are averaged
  over the process set before every step, each all-reduce named after its parameter.
- ``sync="ripples"`` / ``"adpsgd-sync"`` (``decentralized_optimizer``): a local step, then
  every ``sync_every`` steps a Partial All-Reduce of the parameters (and of the model's
  floating buffers when ``model=`` is given) over the group the schedule gives.
- ``sync="adpsgd"`` (``adpsgd_optimizer``): asynchronous AD-PSGD, pairwise averaging
  between active and passive ranks served by a responder thread.
- ``sync="ps"`` (``ripples.ps.optimizer``): parameter servers.
"""
from __future__ import annotations

import enum
import numbers
import warnings
from typing import List, Tuple

import torch

from ripples import runtime as _runtime
from ripples.ops.collectives import allgather_object
from ripples.ops.process_sets import ProcessSet, global_process_set
from ripples.core.reduce_ops import ReduceOp, check_op
from ripples.schedule import Schedule
from ripples.torch.adpsgd_optimizer import AdpsgdOptimizer
from ripples.torch.allreduce_optimizer import AllreduceOptimizer, fusion_units
from ripples.torch.compression import Compression
from ripples.torch.decentralized_optimizer import (SCHEDULES, DecentralizedOptimizer,
                                                   averaged_tensors, make_mode_schedule,
                                                   schedule_kind)
from ripples.torch.optimizer_base import GradientsPendingError
from ripples.torch.ownership import take_over

__all__ = ["DistributedOptimizer", "Sync", "GradientsPendingError", "SCHEDULES",
           "averaged_tensors"]


class Sync(enum.Enum):
    """How replicas are kept in step."""

    ALLREDUCE = "allreduce"
    RIPPLES = "ripples"
    ADPSGD = "adpsgd"
    ADPSGD_SYNC = "adpsgd-sync"
    PS = "ps"


_DEFAULT_GROUP_SIZE = 4


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op=ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0, num_groups: int = 0,
                         groups=None, sparse_as_dense: bool = False,
                         process_set=global_process_set, sync="allreduce", schedule=None,
                         group_size=None, sync_every=None, model=None, **options):
    """Wrap ``optimizer`` so that replicas on all ranks train one model.

    The result is a ``torch.optim.Optimizer`` sharing ``optimizer``'s ``param_groups`` and
    ``state`` (LR schedulers and ``GradScaler`` accept it). Construction is collective
    (over ``process_set`` for ``"allreduce"``, all ranks otherwise): every rank must wrap a
    model of the same parameter names, shapes and dtypes, or every rank raises a
    ``ValueError`` naming the first differing rank.

    Horovod's arguments, in Horovod's order and with Horovod's meaning (they apply to
    ``sync="allreduce"``; other modes warn that they ignore them):

    named_parameters: ``(name, tensor)`` pairs, usually ``model.named_parameters()``. It
        must name every optimizer parameter (else ``ValueError``); pairs the optimizer does
        not own are ignored. Default: names from the parameter positions.
    compression: ``Compression.none``, ``fp16`` or ``bf16``.
    backward_passes_per_step: backward passes accumulated locally per ``step()``.
    op: ``Average`` (default) or ``Sum``, ``Min``, ``Max``, ``Product``.
    gradient_predivide_factor: with ``Average``, divide by it before the sum and multiply
        after (the result is the same average).
    num_groups: deprecated alias of an int ``groups``.
    groups: fusion hint: an int ``k`` (all-reduce the parameters in ``k`` fused groups) or
        a list of lists of parameters (each list fused). Results do not change.
    sparse_as_dense: all-reduce sparse gradients densely instead of all-gathering their
        indices and values; the gradient handed back is sparse either way.
    process_set: the ranks gradients are averaged over (``"allreduce"`` only); ranks
        outside it may wrap too and then step on their own gradients.

    Only parameters the optimizer owns and that require grad at wrapping time take part.

    ripples adds:

    sync: ``"allreduce"`` | ``"ripples"`` | ``"adpsgd"`` | ``"adpsgd-sync"`` | ``"ps"`` (or a
        ``Sync`` member). ``"adpsgd"`` is asynchronous AD-PSGD (see ``AdpsgdOptimizer``:
        an active rank averages with a random passive one that answers while it
        computes); ``"adpsgd-sync"`` runs the same pairs in lock-step, as P-Reduces.
    schedule: for ``"ripples"``: ``"static"``, ``"random"``, ``"generator"``,
        ``"generator-node"`` (the generator grouping ranks of one node first; ranks numbered
        node by node, as ``mpiexec`` places them by default) or a
        ``ripples.schedule.Schedule`` object. Default: ``"generator-node"`` when the ranks
        sit on several hosts, the same number on each, numbered host by host;
        ``"generator"`` otherwise.
    group_size: ranks per group for the random and generator schedules (default 4).
    sync_every: P-Reduce (with AD-PSGD: exchange) every this many local steps (default 1).
    model: the ``torch.nn.Module``, so that its floating buffers (BatchNorm statistics) are
        averaged with the parameters in decentralized modes. Those modes move the averaged
        tensors into one flat buffer per dtype, each ``.data`` a view into it (see
        ``DecentralizedOptimizer``).
    options: for ``"ps"``: ``policy``, ``staleness`` and the other options of the
        parameter-server mode; for ``"ripples"`` with the generator: ``policy`` is its Group
        Division policy, ``"ready"`` (default) or ``"all"``.

    Errors: a wrong type raises ``TypeError``, a wrong value ``ValueError``, each naming the
    argument, on every rank and before any communication. With ``"allreduce"``,
    ``zero_grad()`` between ``backward()`` and ``step()``/``synchronize()``, or more
    backward passes than ``backward_passes_per_step`` before ``step()``, raise
    ``GradientsPendingError`` (an ``AssertionError``, as in Horovod).

    ``state_dict()`` holds the wrapped optimizer's state plus, under ``"ripples"``, the
    wrapper's counters (steps, P-Reduce rounds, pending backward passes), so that a run
    resumed with ``load_state_dict`` equals an uninterrupted one bit for bit in
    ``"allreduce"`` mode, with the ``"static"`` and ``"random"`` schedules and with
    ``"adpsgd-sync"``. Asynchronous ``"adpsgd"`` restores its counters (the same partners
    are drawn) but not the timing of exchanges, so it does not repeat a run bit for bit.
    The ``"generator"`` schedule forms groups from the order in which ranks become ready:
    a resumed run restores the state but not the identical sequence of groups.

    A new ``DistributedOptimizer`` (all-reduce or decentralized) over parameters that an
    earlier one serves takes them over: the earlier one is closed (its buckets, hooks,
    schedule and flat buffers released; a decentralized one first runs the groups already
    assigned to it), so a script may build one per training phase without closing the
    last. Optimizers over different parameters (a GAN's two models) run side by side.
    """
    mode = _choice(Sync, sync, "sync")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got "
                        f"{type(optimizer).__name__}")
    owned = _owned_parameters(optimizer, named_parameters)
    trainable = [(n, p) for n, p in owned if p.requires_grad]
    op = check_op(op)
    _check_horovod_arguments(compression, backward_passes_per_step, op,
                             gradient_predivide_factor, sparse_as_dense, process_set)
    groups = _check_groups(num_groups, groups, owned)
    for argument, value in (("sync_every", sync_every), ("group_size", group_size)):
        if value is not None:
            _check_int(argument, value, 1)
    if mode is not Sync.ALLREDUCE and len(process_set.group()) != _runtime.current().size:
        raise ValueError(f"process_set applies to sync='allreduce' only; sync={mode.value!r} "
                         "runs over all ranks: leave process_set at its default")
    if mode is Sync.ADPSGD and schedule is not None:
        raise ValueError("sync='adpsgd' has its own pairing; leave schedule=None")
    kind = None if mode in (Sync.ALLREDUCE, Sync.PS, Sync.ADPSGD) else schedule_kind(
        mode is Sync.ADPSGD_SYNC, schedule, _runtime.current().hosts_node_by_node)
    division = options.pop("policy", "ready") if mode is Sync.RIPPLES else "ready"
    if mode is not Sync.PS and options:
        raise TypeError(f"DistributedOptimizer() got unexpected arguments {sorted(options)} for "
                        f"sync={mode.value!r}; see the DistributedOptimizer docstring")
    _warn_ignored(mode, dict(
        compression=compression, backward_passes_per_step=backward_passes_per_step, op=op,
        gradient_predivide_factor=gradient_predivide_factor, groups=groups,
        sparse_as_dense=sparse_as_dense, schedule=schedule, group_size=group_size,
        sync_every=sync_every, model=model))

    if mode is Sync.PS:
        return _parameter_server(optimizer, owned, options)
    take_over(owned, _runtime.current().rank)
    if mode is Sync.ALLREDUCE:
        if process_set.included():
            units = fusion_units(trainable, groups)
            # Whether buckets are built (a collective) follows from these: agree on them first.
            _check_same_model(trainable, process_set, [
                ("fusion groups", [[n for n, _ in unit] for unit in units]),
                ("compression", getattr(compression, "__name__", repr(compression))),
                ("op", str(op)), ("bucket_bytes", _runtime.current().config.bucket_bytes)])
        return AllreduceOptimizer(optimizer, trainable, compression, backward_passes_per_step,
                                  op, gradient_predivide_factor, process_set, groups,
                                  sparse_as_dense,
                                  frozen=[(n, p) for n, p in owned if not p.requires_grad])
    _check_same_model(trainable)
    if mode is Sync.ADPSGD:
        return AdpsgdOptimizer(optimizer, trainable, mode,
                               1 if sync_every is None else sync_every, model)
    size = _DEFAULT_GROUP_SIZE if group_size is None else group_size

    def new_schedule():
        return make_mode_schedule(_runtime.current(), kind, size, division)

    return DecentralizedOptimizer(optimizer, trainable, mode, new_schedule(),
                                  1 if sync_every is None else sync_every, model,
                                  None if isinstance(kind, Schedule) else new_schedule)


def _choice(enum_type, value, argument: str):
    if isinstance(value, enum_type):
        return value
    for member in enum_type:
        if member.value == value:
            return member
    raise ValueError(f"{argument}={value!r} is not valid; choose one of "
                     f"{[m.value for m in enum_type]}")


def _check_int(argument: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{argument} must be an int >= {low}, got {value!r}")
    if value < low:
        raise ValueError(f"{argument} must be >= {low}, got {value}")


def _owned_parameters(optimizer, named_parameters) -> List[Tuple[str, torch.Tensor]]:
    """``(name, parameter)`` for every optimizer parameter, in the optimizer's order."""
    if named_parameters is None:
        return [(f"allreduce.noname.{g}.{i}", p)
                for g, group in enumerate(optimizer.param_groups)
                for i, p in enumerate(group["params"])]
    named = list(named_parameters)
    if not all(isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
               and isinstance(item[1], torch.Tensor) for item in named):
        raise ValueError("named_parameters must be a sequence of (name, tensor) tuples, "
                         "usually model.named_parameters()")
    seen, duplicates = set(), set()
    for name, _ in named:
        (duplicates if name in seen else seen).add(name)
    if duplicates:
        raise ValueError(f"named_parameters must have unique names; duplicates: "
                         f"{sorted(duplicates)}")
    name_of = {}
    for name, p in named:
        name_of.setdefault(id(p), name)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    missing = [i for i, p in enumerate(params) if id(p) not in name_of]
    if missing:
        raise ValueError(f"named_parameters was given but does not name the optimizer's "
                         f"parameters at positions {missing}; pass model.named_parameters() "
                         "of the model the optimizer trains")
    return [(name_of[id(p)], p) for p in params]


def _check_horovod_arguments(compression, backward_passes_per_step, op, predivide,
                             sparse_as_dense, process_set) -> None:
    if not (callable(getattr(compression, "compress", None))
            and callable(getattr(compression, "decompress", None))):
        raise TypeError(f"compression must be a compressor such as Compression.none or "
                        f"Compression.fp16, got {compression!r}")
    _check_int("backward_passes_per_step", backward_passes_per_step, 1)
    if isinstance(predivide, bool) or not isinstance(predivide, numbers.Real):
        raise TypeError(f"gradient_predivide_factor must be a number > 0, got {predivide!r}")
    if not predivide > 0:
        raise ValueError(f"gradient_predivide_factor must be > 0, got {predivide}")
    if predivide != 1.0 and op is not ReduceOp.AVERAGE:
        raise ValueError(f"gradient_predivide_factor={predivide} needs op=Average (got "
                         f"op={op.value}); leave the factor at 1.0 with other ops")
    if not isinstance(sparse_as_dense, bool):
        raise TypeError(f"sparse_as_dense must be True or False, got {sparse_as_dense!r}")
    if not isinstance(process_set, ProcessSet):
        raise TypeError(f"process_set must be a ProcessSet from add_process_set() or "
                        f"global_process_set, got {type(process_set).__name__}")


def _check_groups(num_groups, groups, owned):
    """Horovod's ``groups`` (and its deprecated ``num_groups``), validated: None, an int
    > 0, or a list of lists of the optimizer's parameters, each parameter at most once."""
    _check_int("num_groups", num_groups, 0)
    if num_groups:
        warnings.warn("num_groups is deprecated (as in Horovod); pass groups=num_groups",
                      DeprecationWarning, stacklevel=3)
        if groups is None:
            groups = num_groups
    if groups is None:
        return None
    if isinstance(groups, bool) or not isinstance(groups, (numbers.Integral, list)):
        raise ValueError(f"groups should be a positive int or a list of lists of "
                         f"torch.Tensor, got {type(groups).__name__}")
    if isinstance(groups, numbers.Integral):
        if groups <= 0:
            raise ValueError(f"groups should be a positive int or a list of lists of "
                             f"torch.Tensor, got {groups}")
        return int(groups)
    owned_ids = {id(p) for _, p in owned}
    grouped = set()
    for group in groups:
        if not isinstance(group, (list, tuple)):
            raise ValueError("groups must be a list of lists of torch.Tensor, got an element "
                             f"of type {type(group).__name__}")
        for p in group:
            if not isinstance(p, torch.Tensor):
                raise ValueError(f"groups must consist of torch.Tensor, got "
                                 f"{type(p).__name__}")
            if id(p) in grouped:
                raise ValueError("a parameter can only appear once in groups")
            if id(p) not in owned_ids:
                raise ValueError("groups contains a tensor that is not one of the optimizer's "
                                 "parameters; list only parameters the optimizer trains")
            grouped.add(id(p))
    return groups


# The value each argument has when not given, and the modes that use it.
_ARGUMENT_USE = {
    "compression": (Compression.none, {Sync.ALLREDUCE}),
    "backward_passes_per_step": (1, {Sync.ALLREDUCE}),
    "op": (ReduceOp.AVERAGE, {Sync.ALLREDUCE}),
    "gradient_predivide_factor": (1.0, {Sync.ALLREDUCE}),
    "groups": (None, {Sync.ALLREDUCE}),
    "sparse_as_dense": (False, {Sync.ALLREDUCE}),
    "schedule": (None, {Sync.RIPPLES, Sync.ADPSGD, Sync.ADPSGD_SYNC}),
    "group_size": (None, {Sync.RIPPLES}),
    "sync_every": (None, {Sync.RIPPLES, Sync.ADPSGD, Sync.ADPSGD_SYNC}),
    "model": (None, {Sync.RIPPLES, Sync.ADPSGD, Sync.ADPSGD_SYNC}),
}


def _warn_ignored(mode: Sync, given: dict) -> None:
    """One warning per argument given a value that ``mode`` does not use."""
    for argument, value in given.items():
        default, modes = _ARGUMENT_USE[argument]
        if mode not in modes and value is not default and value != default:
            shown = "[...]" if isinstance(value, list) else repr(value)
            users = "/".join(sorted(m.value for m in modes))
            warnings.warn(f"DistributedOptimizer(sync={mode.value!r}) ignores "
                          f"{argument}={shown}: it applies to sync={users} only",
                          UserWarning, stacklevel=3)


def _parameter_server(optimizer, owned, options):
    rt = _runtime.current()
    if rt.ps is None:
        raise ValueError("sync='ps' needs parameter servers: init(ps_servers=K), "
                         "RIPPLES_PS_SERVERS=K or ripplesrun --ps-servers K")
    from ripples.ps.optimizer import PSOptimizer
    _check_same_model(owned)
    wrapped = PSOptimizer(optimizer, owned, rt.ps, timeout_s=rt.config.timeout_s, **options)
    rt.join_hooks.append(wrapped.join)
    return wrapped


def _check_same_model(named, process_set=global_process_set, extra=()) -> None:
    """Compare parameter names, shapes and dtypes (and the ``(label, value)`` pairs of
    ``extra``, e.g. the fusion plan) across the ranks, in one collective."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
    mine += [(label, repr(value)) for label, value in extra]
    everyone = allgather_object(mine, process_set=process_set)
    for rank, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            diff = next((a, b) for a, b in zip(everyone[0] + [None] * len(theirs),
                                              theirs + [None] * len(everyone[0])) if a != b)
            raise ValueError(f"rank {rank} wraps a different model, or passes different "
                             f"arguments, than rank 0: first difference {diff[1]} (rank {rank}) "
                             f"vs {diff[0]} (rank 0). Every rank must build the same model and "
                             "call DistributedOptimizer with the same arguments")
