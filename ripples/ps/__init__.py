"""Thin parameter-server mode: server ranks hold parameter chunks, workers push gradients
and pull parameters under a synchronization policy (BSP, ASP, SSP, DynSGD, ConSGD,
Sync-opt, eager pull, CASP communities, EPSP and FlexRR-lite tasks).

``start(world_comm, config)`` splits the job (servers never return from it);
``ripples.ps.optimizer.PSOptimizer`` is the worker's optimizer wrapper; ``TaskSampler``
gives an EPSP/FlexRR worker its micro-batches.
"""
from .context import PSContext, start
from .epsp import TaskSampler

__all__ = ["PSContext", "TaskSampler", "start"]
