"""``DistributedOptimizer``: Horovod's wrapper, plus decentralized modes.

``sync="allreduce"`` (default) is Horovod: gradients are averaged over all ranks every
step, their all-reduces queued from gradient hooks during backward and fused.
``sync="ripples"`` is decentralized training: a local optimizer step, then every
``sync_every`` steps one fused Partial All-Reduce of the parameters (and of the model's
floating-point buffers, e.g. BatchNorm statistics, when ``model=`` is given) over the group
the schedule gives. Optimizer state (momentum) stays local. ``sync="adpsgd"`` is the AD-PSGD
baseline on the same path (pairs, active/passive split).
"""
from __future__ import annotations

import enum
import time
from typing import Iterable, List, Optional, Tuple

import torch

from ripples import runtime as _runtime
from ripples.heterogeneity import SlowdownInjector
from ripples.metrics import RankMetrics
from ripples.optim_wrapper import OptimizerWrapper
from ripples.ops.collectives import (allgather_object, allreduce_async_, grouped_allreduce_,
                                     synchronize)
from ripples.ops.partial import grouped_partial_allreduce_
from ripples.ops.process_sets import global_process_set
from ripples.ops.reduce_ops import ReduceOp, check_op
from ripples.schedule import Schedule, make_schedule
from ripples.torch.compression import Compression


class Sync(enum.Enum):
    """How replicas are kept in step."""

    ALLREDUCE = "allreduce"
    RIPPLES = "ripples"
    ADPSGD = "adpsgd"
    PS = "ps"


SCHEDULES = ("static", "random", "generator")


def _choice(enum_type, value, argument: str):
    if isinstance(value, enum_type):
        return value
    for member in enum_type:
        if member.value == value:
            return member
    raise ValueError(f"{argument}={value!r} is not valid; choose one of "
                     f"{[m.value for m in enum_type]}")


def DistributedOptimizer(optimizer, named_parameters=None, compression=Compression.none,
                         backward_passes_per_step: int = 1, op=ReduceOp.AVERAGE,
                         gradient_predivide_factor: float = 1.0,
                         process_set=global_process_set, sync="allreduce", schedule=None,
                         group_size: int = 4, sync_every: int = 1, model=None, **options):
    """Wrap ``optimizer`` so that replicas on all ranks train one model.

    Horovod's arguments keep Horovod's meaning. ripples adds:

    sync: ``"allreduce"`` | ``"ripples"`` | ``"adpsgd"`` | ``"ps"`` (or a ``Sync`` member).
    schedule: for ``"ripples"``: ``"static"``, ``"random"``, ``"generator"`` (default) or a
        ``ripples.schedule.Schedule`` object.
    group_size: ranks per group for the random and generator schedules.
    sync_every: P-Reduce every this many local steps.
    model: the ``torch.nn.Module``, so that its floating buffers (BatchNorm statistics) are
        averaged with the parameters in decentralized modes.
    options: for ``"ps"``: ``policy``, ``staleness`` and the other options of the
        parameter-server mode; for ``"ripples"`` with the generator: ``policy`` is its Group
        Division policy, ``"ready"`` (default) or ``"all"``.

    Every rank must wrap a model of the same parameter names, shapes and dtypes; otherwise
    a ``ValueError`` naming the first differing rank is raised on every rank.
    """
    mode = _choice(Sync, sync, "sync")
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise TypeError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
    named = _named_parameters(optimizer, named_parameters)
    if mode is Sync.PS:
        rt = _runtime.current()
        if rt.ps is None:
            raise ValueError("sync='ps' needs parameter servers: init(ps_servers=K), "
                             "RIPPLES_PS_SERVERS=K or ripplesrun --ps-servers K")
        from ripples.ps.optimizer import PSOptimizer
        _check_same_model(named)
        wrapped = PSOptimizer(optimizer, named, rt.ps, timeout_s=rt.config.timeout_s, **options)
        rt.join_hooks.append(wrapped.join)
        return wrapped
    division = options.pop("policy", "ready") if mode is Sync.RIPPLES else "ready"
    if options:
        raise TypeError(f"unexpected arguments {sorted(options)} for sync={mode.value!r}")
    _check_same_model(named, process_set if mode is Sync.ALLREDUCE else global_process_set)
    if mode is Sync.ALLREDUCE:
        return _AllreduceOptimizer(optimizer, named, compression, backward_passes_per_step,
                                   check_op(op), gradient_predivide_factor, process_set)
    if sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {sync_every}")
    return _DecentralizedOptimizer(optimizer, named, mode, schedule, group_size, sync_every, model,
                                   division)


def _named_parameters(optimizer, named_parameters) -> List[Tuple[str, torch.Tensor]]:
    params = [p for group in optimizer.param_groups for p in group["params"]]
    if named_parameters is None:
        return [(f"param.{i}", p) for i, p in enumerate(params)]
    named = list(named_parameters)
    names = [n for n, _ in named]
    if len(set(names)) != len(names):
        raise ValueError("named_parameters contains duplicate names")
    known = {id(p) for _, p in named}
    missing = [i for i, p in enumerate(params) if id(p) not in known]
    if missing:
        raise ValueError(f"named_parameters does not name optimizer parameters at positions "
                         f"{missing}; pass model.named_parameters() of the optimized model")
    return [(n, p) for n, p in named if p.requires_grad]


def _check_same_model(named, process_set=global_process_set) -> None:
    """Compare parameter names, shapes and dtypes across the ranks (one collective)."""
    mine = [(n, tuple(p.shape), str(p.dtype)) for n, p in named]
    everyone = allgather_object(mine, process_set=process_set)
    for rank, theirs in enumerate(everyone):
        if theirs != everyone[0]:
            diff = next((a, b) for a, b in zip(everyone[0] + [None] * len(theirs),
                                              theirs + [None] * len(everyone[0])) if a != b)
            raise ValueError(f"rank {rank} wraps a different model than rank 0: first difference "
                             f"{diff[1]} (rank {rank}) vs {diff[0]} (rank 0). Every rank must "
                             "build the same model before DistributedOptimizer")


class _WrappedOptimizer(OptimizerWrapper):
    """The user's optimizer plus what every mode records: metrics, slowdown, timeline."""

    def __init__(self, optimizer, named):
        super().__init__(optimizer)
        self._named = named
        rt = _runtime.current()
        self._runtime = rt
        self.metrics = RankMetrics(rt.rank)
        self._injector = SlowdownInjector.from_config(rt.config, rt.rank, rt.size)
        self._step_end = time.perf_counter()
        if rt.config.metrics_path:
            rt.at_shutdown(lambda: self.metrics.write_json(rt.config.metrics_path))

    def _finish_compute(self) -> None:
        """Close the compute phase of a step: emulated compute and injected slowdown."""
        elapsed = time.perf_counter() - self._step_end
        if self._injector.enabled:
            start = time.perf_counter()
            self._injector.finish_step(elapsed)
            elapsed = time.perf_counter() - self._step_end
            self._runtime.timeline.complete("slowdown", "compute", start,
                                            time.perf_counter() - start)
        self._runtime.timeline.complete("compute", "compute", self._step_end, elapsed)

    def _end_step(self) -> None:
        self.metrics.add_step()
        self._step_end = time.perf_counter()


class _AllreduceOptimizer(_WrappedOptimizer):
    """Horovod semantics: average gradients over the process set before every step."""

    def __init__(self, optimizer, named, compression, backward_passes_per_step, op,
                 predivide, process_set):
        super().__init__(optimizer, named)
        if backward_passes_per_step < 1:
            raise ValueError(f"backward_passes_per_step must be >= 1, got {backward_passes_per_step}")
        if predivide <= 0:
            raise ValueError(f"gradient_predivide_factor must be > 0, got {predivide}")
        if predivide != 1.0 and op is not ReduceOp.AVERAGE:
            raise ValueError("gradient_predivide_factor is only defined for op=Average")
        self._compression = compression
        self._passes = backward_passes_per_step
        self._op = op
        self._prescale = 1.0 / predivide
        self._postscale = predivide
        self._process_set = process_set
        self._delay = {p: backward_passes_per_step for _, p in named}
        self._handles: dict = {}
        self._synchronized = False
        self._skip_sync = False
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for _, p in named]

    def _on_grad(self, param: torch.Tensor) -> None:
        if param in self._handles:
            raise RuntimeError("a gradient was computed twice before step(): call step() or "
                               "synchronize() after each backward, or raise "
                               "backward_passes_per_step")
        self._delay[param] -= 1
        if self._delay[param] == 0:
            self._handles[param] = self._start(param)

    def _start(self, param):
        compressed, ctx = self._compression.compress(param.grad)
        handle = allreduce_async_(compressed, op=self._op, prescale_factor=self._prescale,
                                  postscale_factor=self._postscale, process_set=self._process_set)
        return handle, compressed, ctx

    def synchronize(self) -> None:
        """Finish every gradient all-reduce (parameters without a gradient count as zeros)."""
        self._finish_compute()
        for _, param in self._named:
            if param not in self._handles:
                if param.grad is None:
                    param.grad = torch.zeros_like(param)
                self._handles[param] = self._start(param)
        with self.metrics.waiting():
            for param, (handle, compressed, ctx) in self._handles.items():
                synchronize(handle)
                if compressed is not param.grad:
                    param.grad.copy_(self._compression.decompress(compressed, ctx))
        self._handles.clear()
        self._delay = {p: self._passes for _, p in self._named}
        self._synchronized = True

    def skip_synchronize(self):
        """Context manager: the next ``step()`` inside it does not synchronize again
        (use after an explicit ``synchronize()``, e.g. for gradient clipping)."""
        optimizer = self

        class _Skip:
            def __enter__(self):
                optimizer._skip_sync = True

            def __exit__(self, *exc):
                optimizer._skip_sync = False

        return _Skip()

    def step(self, closure=None):
        if not (self._skip_sync and self._synchronized):
            self.synchronize()
        self._synchronized = False
        result = self.optimizer.step(closure)
        self._end_step()
        return result


def averaged_tensors(named, model) -> List[torch.Tensor]:
    """The tensors decentralized modes average: parameters, then floating buffers of ``model``."""
    tensors = [p.data for _, p in named]
    if model is not None:
        tensors += [b for b in model.buffers() if b.dtype.is_floating_point]
    return tensors


class _DecentralizedOptimizer(_WrappedOptimizer):
    """Local step, then a P-Reduce of parameters over the schedule's group."""

    def __init__(self, optimizer, named, mode, schedule, group_size, sync_every, model,
                 division):
        super().__init__(optimizer, named)
        rt = self._runtime
        self.mode = mode
        self.schedule = self._make_schedule(rt, mode, schedule, group_size, division)
        self._tensors = averaged_tensors(named, model)
        self._sync_every = sync_every
        self._steps = 0
        self._syncs = 0
        self._left = False
        rt.join_hooks.append(self.leave)
        rt.at_shutdown(self.close)

    @staticmethod
    def _make_schedule(rt, mode, schedule, group_size, division) -> Schedule:
        if isinstance(schedule, Schedule):
            return schedule
        if mode is Sync.ADPSGD:
            if schedule is not None:
                raise ValueError("sync='adpsgd' has its own pairing; leave schedule=None")
            kind = "adpsgd"
        else:
            kind = "generator" if schedule is None else schedule
            if kind not in SCHEDULES:
                raise ValueError(f"schedule={schedule!r} is not valid; choose one of "
                                 f"{list(SCHEDULES)} or pass a ripples.schedule.Schedule")
        size = min(group_size, rt.size)
        return make_schedule(kind, rank=rt.rank, size=rt.size, local_size=rt.local_size,
                             group_size=size, seed=rt.config.seed, comm=rt.service_comm,
                             timeout_s=rt.config.timeout_s, policy=division)

    def step(self, closure=None):
        if self._left:
            raise RuntimeError(f"rank {self._runtime.rank} called step() after join()")
        self._finish_compute()
        result = self.optimizer.step(closure)
        self._steps += 1
        if self._steps % self._sync_every == 0:
            with self.metrics.waiting():  # asking the generator is waiting too
                assignments = self.schedule.groups_for_step(self._syncs)
            self._run(assignments)
            self._syncs += 1
        self._end_step()
        return result

    def synchronize(self) -> None:
        """Nothing to wait for: decentralized modes communicate inside ``step()``."""

    def _run(self, assignments) -> None:
        with self.metrics.waiting():
            for _, group in assignments:
                grouped_partial_allreduce_(self._tensors, group)
                self.metrics.add_group(len(group))

    def leave(self) -> None:
        """Stop training on this rank: run the groups already assigned to it, get no more."""
        if not self._left:
            self._left = True
            self._run(self.schedule.leave())

    def close(self) -> None:
        self.leave()
        self.schedule.close()
