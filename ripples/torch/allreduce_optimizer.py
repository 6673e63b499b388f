"""``sync="allreduce"``: Horovod's semantics, gradients averaged over the process set.

Two paths, chosen per parameter when the optimizer is made (and again when the set of
gradients changes, see below):

- **Buckets** (float32/float64/float16/bfloat16 host gradients, op Sum or Average,
  compression ``none``, ``fp16`` or ``bf16``, ``Config.bucket_bytes > 0``): each
  ``param.grad`` is a view into a flat bucket (``gradient_buckets``), planned once on
  every rank alike. A gradient hook
  marks a parameter final after its last backward pass; a bucket whose parameters are all
  final is all-reduced at once, in plan order, on a communication thread, while backward
  goes on. ``step()`` waits only for what is still in flight. No per-step negotiation: one
  fixed-size record per step checks that every member is at the same step of the plan.
  With ``fp16``/``bf16`` a bucket travels in 16 bits: cast into a 16-bit buffer, summed
  with float32 accumulation at 2 bytes per element on the wire, cast back. A 16-bit
  model's bucket is summed that way in place.
- **By name** (everything else: CUDA gradients, user-defined compressors, Min/Max/Product,
  sparse gradients): ``synchronize()`` submits one all-reduce per parameter (or fusion
  group) named after the parameter, negotiated by name.

Either way every rank reduces each parameter with the same parameter whichever layers it
skipped: a parameter without a gradient on a rank contributes zeros there (its ``grad``
becomes zeros, as in Horovod). The plan is re-agreed (collectively, at ``synchronize()``)
when a parameter frozen at wrapping time starts requiring grad, or a bucketed parameter
produces a sparse gradient; that step reduces the newcomers by name.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Dict, List, Optional, Tuple

import torch

from ripples.ops.bucket_reducer import SUPPORTED_OPS
from ripples.ops.collectives import (allgather_object, allreduce_async_,
                                     grouped_allreduce_async_, sparse_allreduce_async,
                                     synchronize)
from ripples.core.reduce_ops import ReduceOp
from ripples.torch.compression import Compression
from ripples.torch.gradient_buckets import GradientBuckets, bucketable
from ripples.torch.optimizer_base import GradientsPendingError, WrappedOptimizer
from ripples.torch.ownership import record

Named = List[Tuple[str, torch.Tensor]]
# The compressors buckets implement, each with the dtype a bucket travels in.
_BUCKET_WIRES = ((Compression.none, None), (Compression.fp16, torch.float16),
                 (Compression.bf16, torch.bfloat16))


def fusion_units(named: Named, groups) -> List[Named]:
    """The submissions ``synchronize()`` makes, in order: each a list of ``(name, param)``.

    ``groups=None``: one per parameter. An int ``k``: the parameters split in order into
    ``k`` near-equal runs. A list of lists of tensors: those lists (restricted to ``named``),
    then every remaining parameter alone. A unit is submitted when its first member's turn
    comes in parameter order, so the order is the same on every rank.
    """
    if groups is None:
        return [[item] for item in named]
    if isinstance(groups, int):
        count = min(groups, len(named))
        size, extra = divmod(len(named), max(count, 1))
        units, start = [], 0
        for i in range(count):
            end = start + size + (1 if i < extra else 0)
            units.append(named[start:end])
            start = end
        return units
    position = {id(p): i for i, (_, p) in enumerate(named)}
    group_of: Dict[int, int] = {}
    for index, group in enumerate(groups):
        for p in group:
            if id(p) in position:
                group_of[id(p)] = index
    units, started = [], {}
    for name, p in named:
        index = group_of.get(id(p))
        if index is None:
            units.append([(name, p)])
        elif index not in started:
            started[index] = len(units)
            units.append([(name, p)])
        else:
            units[started[index]].append((name, p))
    return units


def _nothing() -> None:
    pass


def _weak_hook(optimizer):
    """A gradient hook that does not keep ``optimizer`` alive: a model wrapped again (a
    new optimizer for the next training stage) must not count passes for the old one."""
    ref = weakref.ref(optimizer)

    def hook(param):
        alive = ref()
        if alive is not None:
            alive._on_grad(param)
    return hook


class AllreduceOptimizer(WrappedOptimizer):
    """Average gradients over ``process_set`` before every ``step()`` (Horovod semantics).

    Contract (as Horovod's ``DistributedOptimizer``):

    - ``step()`` synchronizes first, unless inside ``skip_synchronize()`` after an
      explicit ``synchronize()``; ``step()`` after ``synchronize()`` outside that context
      warns and synchronizes again.
    - ``backward_passes_per_step=k``: gradients of ``k`` backward passes accumulate locally;
      a ``(k+1)``-th before ``step()`` raises ``GradientsPendingError``.
    - ``zero_grad()`` between a backward pass and ``step()``/``synchronize()`` raises
      ``GradientsPendingError`` (an ``AssertionError``).
    - Sparse gradients (``nn.Embedding(sparse=True)``) are all-gathered and summed sparsely
      (compression does not apply), or with ``sparse_as_dense=True`` all-reduced densely and
      handed back sparse (rows that are zero on every rank left out). Either way the result
      is sparse. Without ``sparse_as_dense``, a rank where such a parameter got no gradient
      sends dense zeros while the others send sparse ones, so the ranks call different
      collectives and fail (Horovod has the same limit); ``sparse_as_dense=True`` avoids it.
    """

    def __init__(self, optimizer, named: Named, compression, backward_passes_per_step: int,
                 op: ReduceOp, gradient_predivide_factor: float, process_set, groups=None,
                 sparse_as_dense: bool = False, frozen: Named = ()):
        super().__init__(optimizer, named)
        self._compression = compression
        self.backward_passes_per_step = backward_passes_per_step
        self.op = op
        average = op is ReduceOp.AVERAGE
        self._prescale = 1.0 / gradient_predivide_factor if average else 1.0
        self._postscale = gradient_predivide_factor if average else 1.0
        self._process_set = process_set
        self._sparse_as_dense = sparse_as_dense
        self._groups = groups
        self._trainable = list(named)
        self._frozen = list(frozen)  # owned, not requiring grad when last planned
        self._sparse_seen: set = set()
        self._names = {p: name for name, p in named}
        self._passes: Dict[torch.Tensor, int] = {p: 0 for _, p in named}
        self._synchronized = False
        self._hooks = [p.register_post_accumulate_grad_hook(_weak_hook(self)) for _, p in named]
        self._buckets: Optional[GradientBuckets] = None
        self._plan()
        self._runtime.rebuild_hooks.append(self._new_world)

    @property
    def _parameter_names(self) -> Dict[torch.Tensor, str]:
        """Horovod's map of every parameter this optimizer serves to the name its
        gradient is all-reduced under (``allreduce.noname.<group>.<index>`` unless
        ``named_parameters`` named it)."""
        return {p: name for name, p in self._trainable + self._frozen}

    def _plan(self) -> None:
        """Split the trainable parameters between buckets and by-name all-reduces.
        Collective over the process set when any parameter is bucketed."""
        rt = self._runtime
        wires = [wire for compression, wire in _BUCKET_WIRES if compression is self._compression]
        use_buckets = (rt.config.bucket_bytes > 0 and bool(wires)
                       and self.op in SUPPORTED_OPS and self._process_set.included())
        bucketed = [(n, p) for n, p in self._trainable
                    if use_buckets and bucketable(p) and p not in self._sparse_seen]
        if self._buckets is not None:
            self._buckets.close()
        self._buckets = (GradientBuckets(rt, self._process_set.group(), bucketed,
                                         rt.config.bucket_bytes, self.op, self._prescale,
                                         self._postscale, wires[0]) if bucketed else None)
        record(self, self._trainable, _nothing if self._buckets is None else self._buckets.close)
        in_buckets = {p for _, p in bucketed}
        self._units = fusion_units([(n, p) for n, p in self._trainable if p not in in_buckets],
                                   self._groups)

    def _new_world(self) -> None:
        """Ranks died and the survivors are on a smaller world (called by
        ``Runtime.recover`` on each, in the same order): forget the interrupted step's
        gradients and plan the buckets over the new world (collective over it)."""
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = False
        self._plan()

    def _communication_in_compute(self) -> float:
        return 0.0 if self._buckets is None else self._buckets.take_backward_wait()

    def _on_grad(self, param: torch.Tensor) -> None:
        if self._passes[param] >= self.backward_passes_per_step:
            raise GradientsPendingError(
                f"the gradient of {self._names[param]!r} was computed more than "
                f"backward_passes_per_step={self.backward_passes_per_step} times before "
                "step(): call step() after each backward pass, or raise "
                "backward_passes_per_step to accumulate gradients locally")
        self._passes[param] += 1
        self._synchronized = False
        buckets = self._buckets
        if (buckets is not None and self._passes[param] == self.backward_passes_per_step
                and param in buckets):
            if param.grad is not None and param.grad.is_sparse:
                self._sparse_seen.add(param)
            buckets.ready(param)

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes accumulate before each ``step()`` (Horovod)."""
        if isinstance(passes, bool) or not isinstance(passes, int) or passes < 1:
            raise ValueError(f"backward_passes_per_step must be an int >= 1, got {passes!r}")
        self.backward_passes_per_step = passes
        self._passes = dict.fromkeys(self._passes, 0)

    def synchronize(self) -> None:
        """All-reduce every gradient now; ``param.grad`` then holds the reduced value.

        Collective over the process set: every member must call it (``step()`` does). On a
        rank outside the process set it only marks the gradients synchronized.
        """
        self._finish_compute()
        if not self._process_set.included():  # Horovod: non-members keep their own gradients
            self._passes = dict.fromkeys(self._passes, 0)
            self._synchronized = True
            return
        unfrozen = [(n, p) for n, p in self._frozen if p.requires_grad]
        newcomers = unfrozen + [(self._names[p], p) for p in self._sparse_seen
                                if self._buckets is not None and p in self._buckets]
        units = self._units + [[item] for item in newcomers]
        pending = [submission for unit in units for submission in self._submit(unit)]
        with self.metrics.waiting():
            if self._buckets is not None:
                self._buckets.finish()
            for handle, members in pending:
                result = synchronize(handle)
                for param, tensor, ctx, sparse_dim in members:
                    self._take(param, result if tensor is None else tensor, ctx, sparse_dim)
        self._passes = dict.fromkeys(self._passes, 0)
        self._synchronized = True
        if newcomers:
            self._replan(unfrozen)

    def _replan(self, unfrozen: Named) -> None:
        """The set of gradients changed: agree on it with the other members (every rank
        raises ``ValueError`` if they differ) and plan the buckets afresh."""
        for name, param in unfrozen:
            self._frozen.remove((name, param))
            self._trainable.append((name, param))
            self._names[param] = name
            self._passes[param] = 0
            self._hooks.append(param.register_post_accumulate_grad_hook(_weak_hook(self)))
        order = [p for group in self.optimizer.param_groups for p in group["params"]]
        position = {id(p): i for i, p in enumerate(order)}
        self._trainable.sort(key=lambda item: position.get(id(item[1]), 0))
        mine = ([n for n, _ in self._trainable], sorted(self._names[p] for p in self._sparse_seen))
        everyone = allgather_object(mine, process_set=self._process_set)
        differing = [self._process_set.group()[i] for i, theirs in enumerate(everyone)
                     if theirs != mine]
        if differing:
            raise ValueError(
                f"the set of gradients changed differently across ranks: rank(s) {differing} "
                f"train other parameters than rank {self._runtime.rank} (trainable "
                f"{len(mine[0])}, sparse {mine[1]}); every rank must unfreeze the same "
                "parameters at the same step")
        self._plan()

    def _submit(self, unit):
        """Start the all-reduces of one fusion unit: ``[(handle, members)]``, each member
        ``(param, sent tensor or None for a sparse result, ctx, sparse_dim)``."""
        submissions, dense = [], []
        for name, param in unit:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad, sparse_dim = param.grad, None
            if grad.is_sparse and not self._sparse_as_dense:
                handle = sparse_allreduce_async(grad, name=name, op=self.op,
                                                process_set=self._process_set)
                submissions.append((handle, [(param, None, None, None)]))
                continue
            if grad.is_sparse:
                grad, sparse_dim = grad.to_dense(), grad.sparse_dim()
            tensor, ctx = self._compression.compress(grad)
            dense.append((name, (param, tensor, ctx, sparse_dim)))
        if dense:
            tensors = [member[1] for _, member in dense]
            kwargs = dict(name=dense[0][0], op=self.op, prescale_factor=self._prescale,
                          postscale_factor=self._postscale, process_set=self._process_set)
            handle = (allreduce_async_(tensors[0], **kwargs) if len(tensors) == 1
                      else grouped_allreduce_async_(tensors, **kwargs))
            submissions.append((handle, [member for _, member in dense]))
        return submissions

    def _take(self, param, result, ctx, sparse_dim: Optional[int]) -> None:
        if result.is_sparse:
            param.grad = result
            return
        result = self._compression.decompress(result, ctx)
        if sparse_dim is not None:
            param.grad = result.to_sparse(sparse_dim)
        elif result is not param.grad:
            param.grad.copy_(result)

    def step(self, closure=None):
        """Synchronize (see the class contract), then the wrapped optimizer's step."""
        if self._should_synchronize:
            if self._synchronized:
                warnings.warn("optimizer.step() called without optimizer.skip_synchronize() "
                              "context after optimizer.synchronize(): gradients are "
                              "all-reduced again. Wrap step() in "
                              "`with optimizer.skip_synchronize():`",
                              stacklevel=2)
            self.synchronize()
        elif not self._synchronized:
            # Horovod would step on local gradients here and let replicas drift apart.
            self.synchronize()
        self._synchronized = False
        result = self.optimizer.step(closure)
        self._end_step()
        return result

    def zero_grad(self, set_to_none: bool = True):
        pending = [self._names[p] for p, n in self._passes.items() if n]
        if pending:
            raise GradientsPendingError(
                f"optimizer.zero_grad() was called after loss.backward() but before "
                f"optimizer.step() or optimizer.synchronize() (pending gradients: "
                f"{pending[:3]}{'...' if len(pending) > 3 else ''}): the other ranks would "
                "all-reduce gradients this rank has discarded. Call step() (or "
                "synchronize()) first")
        return self.optimizer.zero_grad(set_to_none=set_to_none)

    def extra_state(self) -> dict:
        state = super().extra_state()
        state["backward_passes"] = {self._names[p]: n for p, n in self._passes.items()}
        return state

    def load_extra_state(self, extra: dict) -> None:
        super().load_extra_state(extra)
        saved = extra.get("backward_passes", {})
        self._passes = {p: int(saved.get(self._names[p], 0)) for p in self._passes}
        self._synchronized = False

    def close(self) -> None:
        """Remove the gradient hooks (the optimizer stops counting backward passes) and
        stop the bucket thread."""
        for hook in self._hooks:
            hook.remove()
        self._hooks = []
        if self._new_world in self._runtime.rebuild_hooks:
            self._runtime.rebuild_hooks.remove(self._new_world)
        if self._buckets is not None:
            self._buckets.close()
            self._buckets = None
