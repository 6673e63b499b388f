"""MPI plumbing shared by every collective: torch <-> MPI buffers and bounded waits.

CPU tensors are handed to MPI without copies: a contiguous tensor's memory is exposed
through numpy's buffer protocol. bfloat16 has no numpy dtype, so it travels as int16 bits
when nothing is reduced; reductions of float16/bfloat16 run in a float32 buffer.
"""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional, Sequence

import numpy as np
import torch
from mpi4py import MPI

from ripples.comm import outbox
from ripples.core.errors import RipplesTimeoutError
from ripples.core.reduce_ops import ReduceOp

log = logging.getLogger("ripples")

HALF_TYPES = (torch.float16, torch.bfloat16)
INTEGER_TYPES = (torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64)

_MPI_OPS = {ReduceOp.SUM: MPI.SUM, ReduceOp.AVERAGE: MPI.SUM, ReduceOp.MIN: MPI.MIN,
            ReduceOp.MAX: MPI.MAX, ReduceOp.PRODUCT: MPI.PROD}
# bool travels as uint8 0/1: "sum" is logical or, "product" logical and.
_BOOL_OPS = {ReduceOp.SUM: MPI.MAX, ReduceOp.MAX: MPI.MAX, ReduceOp.MIN: MPI.MIN,
             ReduceOp.PRODUCT: MPI.MIN}


def reduction_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype the reduction runs in: float32 for 16-bit floats, else the tensor's own."""
    return torch.float32 if dtype in HALF_TYPES else dtype


def mpi_op(op: ReduceOp, dtype: torch.dtype, argument: str = "op"):
    """The MPI operation implementing ``op`` on tensors of ``dtype``."""
    if dtype is torch.bool:
        if op not in _BOOL_OPS:
            raise ValueError(f"{argument}={op} is not defined for bool tensors; use Sum (or), "
                             "Product (and), Min or Max")
        return _BOOL_OPS[op]
    return _MPI_OPS[op]


def as_buffer(tensor: torch.Tensor) -> np.ndarray:
    """A buffer MPI reads without a copy: a numpy view of a contiguous CPU tensor, or the
    CUDA tensor itself (for CUDA-aware MPI)."""
    tensor = tensor.detach()
    if tensor.is_cuda:  # CUDA-aware MPI reads device memory via __cuda_array_interface__
        return tensor.reshape(-1)
    if tensor.dtype is torch.bfloat16:
        tensor = tensor.view(torch.int16)
    elif tensor.dtype is torch.bool:
        tensor = tensor.view(torch.uint8)
    return tensor.numpy().reshape(-1)


class Deadline:
    """A bounded wait for one operation: warns once after ``stall_s``, raises after ``timeout_s``.

    ``describe()`` is called only on the slow path, to name the operation, the group and
    whoever is missing. ``missing()`` (optional) gives the world ranks waited for, carried
    by the error. With ``liveness`` (a ``ripples.comm.liveness.Liveness``) an expired wait
    first asks those ranks how they are, and starts afresh while they are alive and busy.
    """

    __slots__ = ("start", "timeout_s", "stall_s", "describe", "missing", "liveness", "_warned")

    def __init__(self, timeout_s: float, stall_s: float, describe: Callable[[], str],
                 missing: Optional[Callable[[], Sequence[int]]] = None, liveness=None):
        self.start = time.monotonic()
        self.timeout_s = timeout_s
        self.stall_s = stall_s
        self.describe = describe
        self.missing = missing
        self.liveness = liveness
        self._warned = False

    def restart(self) -> None:
        """Count the timeout afresh from now (the awaited peers showed signs of life)."""
        self.start = time.monotonic()
        self._warned = False

    def check(self) -> None:
        elapsed = time.monotonic() - self.start
        if elapsed > self.timeout_s:
            error = RipplesTimeoutError(
                f"{self.describe()}: gave up after {self.timeout_s:g} s (Config.timeout_s / "
                "RIPPLES_TIMEOUT_S)", missing=self.missing() if self.missing else ())
            if self.liveness is None:
                raise error
            self.liveness.keep_waiting(error.missing, error)
            self.start = time.monotonic()  # they are alive and busy: wait on, warned
            self._warned = True
            return
        if not self._warned and elapsed > self.stall_s:
            self._warned = True
            log.warning("%s: still waiting after %.0f s", self.describe(), elapsed)


def wait_all(requests: Sequence[MPI.Request], deadline: Deadline) -> None:
    """Wait until all ``requests`` complete or the deadline passes (see ``poll_until``).

    A request that fails raises its own error (e.g. ``ERR_PROC_FAILED`` when the peer
    died), not the ``ERR_IN_STATUS`` that ``Testall`` reports for it.
    """
    statuses = [MPI.Status() for _ in requests]

    def test_all() -> bool:
        try:
            return MPI.Request.Testall(requests, statuses)
        except MPI.Exception as error:
            if error.Get_error_class() != MPI.ERR_IN_STATUS:
                raise
            failed = [s.Get_error() for s in statuses
                      if s.Get_error() not in (MPI.SUCCESS, MPI.ERR_PENDING)]
            if not failed:
                raise
            raise MPI.Exception(failed[0]) from error

    poll_until(test_all, deadline)


def wait_sends(sends: Sequence[MPI.Request], deadline: Deadline) -> None:
    """``wait_all`` for sends. Those still in flight when it raises are kept until they
    complete (``ripples.comm.outbox``): MPI may still read their buffers."""
    try:
        wait_all(sends, deadline)
    except BaseException:
        outbox.keep_until_complete(*sends)
        raise


def poll_until(done: Callable[[], bool], deadline: Deadline,
               idle: Optional[Callable[[], bool]] = None) -> None:
    """Call ``done()`` until it returns True or the deadline passes.

    ``idle`` (optional) is called between polls; when it returns True (it did work with
    the peers, so they are alive) the deadline starts afresh.

    Spins for a moment (a shared-memory round trip takes microseconds), then yields the
    core between polls so that oversubscribed ranks let the peers they wait for run, and
    after a few milliseconds sleeps in short naps; the deadline is checked throughout.
    """
    if done():
        return
    start = time.perf_counter()
    pause = 0.0
    while not done():
        waited = time.perf_counter() - start
        if waited < _SPIN_S:
            continue
        if idle is not None and idle():
            deadline.restart()
        deadline.check()
        if waited < _YIELD_S:
            os.sched_yield()
        else:
            pause = min(_MAX_NAP_S, pause * 2 or 2e-5)
            time.sleep(pause)


_SPIN_S = 100e-6
_YIELD_S = 5e-3
_MAX_NAP_S = 2e-4
