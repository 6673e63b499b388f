"""Horovod's PyTorch API on ripples: ``import ripples.torch as hvd``.

Everything Horovod's ``horovod.torch`` offers for host tensors is here under the same names,
plus Partial All-Reduce (``partial_allreduce``) and decentralized training through
``DistributedOptimizer(..., sync="ripples")``.
"""
from __future__ import annotations

from typing import Optional

from ripples.core import singleton_shm as _singleton_shm

_singleton_shm.start_mpi()  # before anything starts MPI (see the module)

from mpi4py import MPI  # noqa: E402

from ripples import runtime as _runtime
from ripples import startup as _startup
from ripples.core.config import Config
from ripples.core.errors import (MismatchError, NotInitializedError, RanksFailedError, RipplesError,
                            RipplesTimeoutError)
from ripples.ops.collectives import (allgather_async, alltoall_async, broadcast_async,
                                     broadcast_async_, grouped_allgather_async,
                                     grouped_reducescatter_async, reducescatter_async,
                                     sparse_allreduce_async)
from ripples.ops.collectives import (allgather_object, allreduce_, allreduce_async,
                                     allreduce_async_, barrier, broadcast_, broadcast_object,
                                     grouped_allreduce_, grouped_allreduce_async,
                                     grouped_allreduce_async_, poll, synchronize)
from ripples.ops.handles import Handle
from ripples.ops.join import join
from ripples.ops.partial import (grouped_partial_allreduce_, grouped_partial_allreduce_async_,
                                 partial_allreduce_, partial_allreduce_async,
                                 partial_allreduce_async_)
from ripples.ops.process_sets import (ProcessSet, add_process_set, global_process_set,
                                      process_set_by_id, process_sets, remove_process_set)
from ripples.core.reduce_ops import Adasum, Average, Max, Min, Product, ReduceOp, Sum
from ripples.torch.compression import Compression
from ripples.torch.functions import (average_model, broadcast_optimizer_state,
                                     broadcast_parameters, consensus_distance)
from ripples.torch.mpi_ops import (allgather, allreduce, alltoall, broadcast, grouped_allgather,
                                   grouped_allreduce, grouped_reducescatter, partial_allreduce,
                                   reducescatter)
from ripples.torch.optimizer import DistributedOptimizer, Sync
from ripples.torch.sampler import DistributedSampler
from ripples.torch.optimizer_base import GradientsPendingError
from ripples.runtime import on_reset
from ripples.torch import elastic
from ripples.torch.sync_batch_norm import SyncBatchNorm

# Horovod's name for the error a dead rank raises (fault-tolerant mode).
HorovodInternalError = RanksFailedError


def init(comm: Optional[MPI.Comm] = None, process_sets=None, **settings) -> None:
    """Initialize ripples on this rank (collective over ``comm``, default the MPI world).

    ``comm`` may be any mpi4py communicator (e.g. to share a job with Horovod); ripples works
    on private duplicates of it. ``process_sets``: as in Horovod, a list of ``ProcessSet``
    objects to register (each checked against the world size and given its
    ``process_set_id``) or ``"dynamic"``; ripples needs no registration beyond that (a set's
    communicator is built by its members at its first collective). ``settings`` override
    ``Config`` fields (and ``RIPPLES_*``).
    """
    sets = _check_process_sets(process_sets)
    _startup.init(comm, **settings)
    for index, process_set in enumerate(sets):
        try:
            add_process_set(process_set)
        except ValueError as exc:
            raise ValueError(f"init(process_sets=...): process_sets[{index}]: {exc}") from None


def _check_process_sets(process_sets) -> list:
    if process_sets is None or process_sets == "dynamic":
        return []
    if isinstance(process_sets, (str, ProcessSet)) or not hasattr(process_sets, "__iter__"):
        raise TypeError("init(process_sets=...) takes a list of hvd.ProcessSet objects or "
                        f"'dynamic', got {process_sets!r}")
    sets = list(process_sets)
    for index, process_set in enumerate(sets):
        if not isinstance(process_set, ProcessSet):
            raise TypeError(f"init(process_sets=...): process_sets[{index}] must be a "
                            f"hvd.ProcessSet (e.g. hvd.ProcessSet([0, 1])), got "
                            f"{type(process_set).__name__}")
    return sets


def shutdown() -> None:
    """Finish queued collectives and release ripples' communicators."""
    _runtime.shutdown()


def is_initialized() -> bool:
    return _runtime.is_initialized()


def size() -> int:
    return _runtime.current().size


def rank() -> int:
    return _runtime.current().rank


def local_size() -> int:
    return _runtime.current().local_size


def local_rank() -> int:
    return _runtime.current().local_rank


def cross_size() -> int:
    return _runtime.current().cross_size


def cross_rank() -> int:
    return _runtime.current().cross_rank


def mpi_threads_supported() -> bool:
    """True when MPI runs with MPI_THREAD_MULTIPLE."""
    _runtime.current()
    return MPI.Query_thread() == MPI.THREAD_MULTIPLE


def mpi_enabled() -> bool:
    """True: ripples always runs its collectives over MPI."""
    return True


def mpi_built() -> bool:
    return True


def gloo_enabled() -> bool:
    return False


def gloo_built() -> bool:
    return False


def nccl_built() -> int:
    """The NCCL version as an int (e.g. 22105) when the NCCL backend is usable here
    (cupy with NCCL importable), else 0; as in Horovod, truthiness tells whether it is."""
    from ripples.comm import nccl
    return nccl.nccl_version() if nccl.nccl_available() else 0


def ccl_built() -> bool:
    return False


def ddl_built() -> bool:
    return False


def is_homogeneous() -> bool:
    """True when every node runs the same number of ranks (known since ``init()``)."""
    return _runtime.current().homogeneous


def cuda_built() -> bool:
    import torch
    return torch.cuda.is_available()


def rocm_built() -> bool:
    return False


def mpi_library() -> str:
    """Which MPI library is in use (first line of its version string)."""
    return _runtime.mpi_library()


def start_timeline(file_path, mark_cycles: bool = False) -> None:
    """Start recording a timeline to be written at ``file_path`` (as Horovod's).

    Collective: every rank calls it. One timeline records at a time: one already recording
    is stopped and written first. ``mark_cycles`` marks communication cycles.
    """
    _runtime.current().start_timeline(file_path, mark_cycles)


def stop_timeline() -> None:
    """Stop the timeline and write it: one Chrome trace at its path (rank 0 writes every
    rank's events; per-rank files if some rank's do not arrive within ``timeout_s``).
    Collective: every rank calls it. Does nothing when no timeline is recording."""
    _runtime.current().stop_timeline()
