"""Thin parameter-server mode: server ranks hold parameter chunks, workers push gradients
and pull parameters under a synchronization policy (BSP, ASP, SSP, DynSGD, ConSGD,
Sync-opt, eager pull).

``start(world_comm, config)`` splits the job (servers never return from it);
``ripples.ps.optimizer.PSOptimizer`` is the worker's optimizer wrapper.
"""
from .context import PSContext, start

__all__ = ["PSContext", "start"]
