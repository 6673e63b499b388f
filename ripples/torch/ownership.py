"""Which DistributedOptimizer serves which parameter, so that a new one takes over.

Scripts build a new ``DistributedOptimizer`` over the same model for a new training phase
(new parameter groups, a fine-tuning stage) and drop the old one without closing it. Left
open, the old one would keep its gradient buckets and their thread, its schedule (on rank
0 a generator service thread), its flat parameter buffers (a model's worth of memory) and
its part in ``join()``. Every rank builds optimizers in the same order, so every rank
closes the same earlier ones at the same point: ``take_over`` closes, collectively, what
each earlier optimizer holds for a parameter the new one will serve, whether or not the
garbage collector has taken the optimizer itself yet (it does so at a different moment on
each rank). Optimizers over disjoint parameters (a GAN's two models) live side by side.
"""
from __future__ import annotations

import logging
import weakref
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch

log = logging.getLogger("ripples")


class _Entry:
    __slots__ = ("wrapper", "release")

    def __init__(self, wrapper, release: Callable[[], None]):
        self.wrapper = weakref.ref(wrapper)
        self.release = release


# id(parameter) -> (the parameter, weakly; what serves it). Keyed by id, as tensors
# compare element-wise; the weak reference tells a reused id from the same parameter.
# ``release`` is held strongly: it must outlive a dropped optimizer.
_served_by: Dict[int, Tuple[weakref.ref, _Entry]] = {}


def _pop(param: torch.Tensor) -> Optional[_Entry]:
    found = _served_by.pop(id(param), None)
    return found[1] if found is not None and found[0]() is param else None


def serving(param: torch.Tensor):
    """The optimizer that serves ``param`` now, or None."""
    found = _served_by.get(id(param))
    if found is None or found[0]() is not param:
        return None
    return found[1].wrapper()


def take_over(named: Sequence[Tuple[str, torch.Tensor]], rank: int) -> None:
    """Close what serves any of ``named``'s parameters now (collective: call it at the same
    point on every rank, before the new optimizer is built): ``close()`` of an optimizer
    still alive, else the ``release`` it recorded."""
    entries: List[_Entry] = []
    for name, param in named:
        entry = _pop(param)
        if entry is not None and all(entry is not e for e in entries):
            log.info("rank %d: a new DistributedOptimizer serves %s; closing the one that "
                     "served it before", rank, name)
            entries.append(entry)
    closed: List = []
    for entry in entries:
        wrapper = entry.wrapper()
        if wrapper is None:
            entry.release()
        elif all(wrapper is not w for w in closed):
            closed.append(wrapper)
            wrapper.close()


def record(wrapper, named: Sequence[Tuple[str, torch.Tensor]],
           release: Callable[[], None]) -> None:
    """Note that ``wrapper`` (which has ``close()``) serves ``named``, holding what
    ``release`` frees; ``release`` must not keep ``wrapper`` alive."""
    entry = _Entry(wrapper, release)
    for key in [k for k, (param, _) in _served_by.items() if param() is None]:
        del _served_by[key]
    for _, param in named:
        _served_by[id(param)] = (weakref.ref(param), entry)
