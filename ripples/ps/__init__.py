"""Thin parameter-server mode: server ranks hold parameter chunks, workers push gradients
and pull parameters under a synchronization policy (BSP, ASP, SSP, DynSGD, ConSGD,
Sync-opt, eager pull, CASP communities, EPSP and FlexRR-lite tasks).

``start(world_comm, config)`` splits the job (servers never return from it);
``ripples.ps.optimizer.PSOptimizer`` is the worker's optimizer wrapper; ``TaskSampler``
gives an EPSP/FlexRR worker its micro-batches.

The names are imported on first use, so that the pure policy modules (``policies``,
``casp``, ``tasks``) load without torch or MPI (the simulator uses them).
"""
import importlib

_HOMES = {"PSContext": ".context", "start": ".context", "TaskSampler": ".epsp"}

__all__ = ["PSContext", "TaskSampler", "start"]


def __getattr__(name):
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(_HOMES[name], __name__), name)
