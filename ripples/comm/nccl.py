"""NCCL backend for CUDA tensors, through ``cupy.cuda.nccl``.

A :class:`NcclCommunicator` is bootstrapped over an mpi4py communicator (rank 0 of it makes
the NCCL unique id and broadcasts it). Every operation is enqueued on torch's current CUDA
stream and returns without waiting for it, like any CUDA operation. cupy is imported only
when a communicator is built: without it :func:`nccl_available` is False and construction
raises RuntimeError carrying the original ImportError.
"""
from __future__ import annotations

import socket
from typing import Optional, Union

import torch

from ripples.comm.nccl_init import bounded_init
from ripples.core.errors import RipplesError
from ripples.kernels.streams import CudaEvent, current_stream_handle

OPS = ("sum", "min", "max", "prod", "avg")


def _import_nccl():
    try:
        from cupy.cuda import nccl
    except ImportError as exc:
        raise RuntimeError("the NCCL backend needs cupy built with NCCL "
                           f"(pip install 'ripples-mpi[gpu]'): {exc}") from exc
    if not getattr(nccl, "available", True):
        raise RuntimeError("cupy is installed without NCCL support; install a cupy-cuda* "
                           "wheel that bundles NCCL")
    return nccl


def nccl_available() -> bool:
    """True when cupy with NCCL imports and torch sees a CUDA device."""
    try:
        _import_nccl()
    except RuntimeError:
        return False
    return torch.cuda.is_available()


def nccl_version() -> int:
    """NCCL's version number (e.g. 22105); raises RuntimeError when NCCL is unavailable."""
    return int(_import_nccl().get_version())


def _nccl_dtypes(nccl) -> dict:
    table = {
        torch.float16: nccl.NCCL_FLOAT16, torch.float32: nccl.NCCL_FLOAT32,
        torch.float64: nccl.NCCL_FLOAT64, torch.int8: nccl.NCCL_INT8,
        torch.uint8: nccl.NCCL_UINT8, torch.bool: nccl.NCCL_UINT8,
        torch.int32: nccl.NCCL_INT32, torch.int64: nccl.NCCL_INT64,
    }
    bf16 = getattr(nccl, "NCCL_BFLOAT16", None)  # NCCL >= 2.10
    if bf16 is not None:
        table[torch.bfloat16] = bf16
    return table


class NcclCommunicator:
    """A NCCL communicator of ``size`` ranks on one CUDA device.

    Use :meth:`from_mpi` to build one; the constructor takes an already agreed unique id.
    Tensors must be contiguous CUDA tensors on this communicator's device. ``init_timeout_s``
    bounds ``ncclCommInitRank`` (``RipplesTimeoutError`` past it; None: no bound).
    """

    def __init__(self, size: int, unique_id, rank: int, device: Union[torch.device, int, None] = None,
                 watchdog=None, label: str = "an NCCL communicator",
                 init_timeout_s: Optional[float] = None):
        nccl = _import_nccl()
        import cupy

        if not isinstance(size, int) or size < 1:
            raise ValueError(f"size must be a positive int, got {size!r}")
        if not isinstance(rank, int) or not 0 <= rank < size:
            raise ValueError(f"rank must be an int in [0, {size}), got {rank!r}")
        self._nccl = nccl
        self.watchdog = watchdog  # a ripples.comm.nccl_watchdog.NcclWatchdog, or None
        self.label = label
        self.size = size
        self.rank = rank
        self.device = _as_cuda_device(device)
        self._dtypes = _nccl_dtypes(nccl)
        self._ops = {"sum": nccl.NCCL_SUM, "prod": nccl.NCCL_PROD, "min": nccl.NCCL_MIN,
                     "max": nccl.NCCL_MAX}
        avg = getattr(nccl, "NCCL_AVG", None)
        if avg is not None and nccl.get_version() >= 21000:
            self._ops["avg"] = avg
        def make():
            with cupy.cuda.Device(self.device.index):  # current device is per thread
                return nccl.NcclCommunicator(size, unique_id, rank)

        try:
            self._comm = bounded_init(make, init_timeout_s, f"{label} (rank {rank} of {size})")
        except nccl.NcclError as exc:
            raise RipplesError(f"NCCL communicator init failed on rank {rank} of {size}: "
                               f"{exc}") from exc

    @classmethod
    def from_mpi(cls, mpi_comm, device: Union[torch.device, int, None] = None,
                 watchdog=None, label: str = "an NCCL communicator") -> "NcclCommunicator":
        """Bootstrap over ``mpi_comm`` (an mpi4py communicator): collective over all its
        ranks, which must all call it. NCCL rank and size equal the MPI ones. With a
        ``watchdog``, each operation that runs past its timeout aborts the communicator,
        and the next call raises ``RipplesTimeoutError`` naming ``label``; the init itself
        is bounded by the same timeout (``ripples.comm.nccl_init``)."""
        nccl = _import_nccl()
        rank, size = mpi_comm.Get_rank(), mpi_comm.Get_size()
        device = _as_cuda_device(device)
        # NCCL refuses two ranks of one communicator on one GPU, after a wait at best:
        # every member sees the same places and raises the same error instead.
        places = mpi_comm.allgather(_gpu_place(device))
        shared = ranks_sharing_a_gpu(places)
        if shared:
            first, second = shared
            raise RipplesError(
                f"{label}: ranks {first} and {second} of it are both on GPU {places[first]}, "
                "and NCCL needs one GPU per rank: give each local rank its own GPU "
                "(torch.cuda.set_device(hvd.local_rank())), or set RIPPLES_GPU_PATH=host to "
                "reduce CUDA tensors through host memory (ranks may then share a GPU)")
        unique_id = nccl.get_unique_id() if rank == 0 else None
        unique_id = mpi_comm.bcast(unique_id, root=0)
        return cls(size, unique_id, rank, device, watchdog, label,
                   init_timeout_s=None if watchdog is None else watchdog.timeout_s)

    # -- collectives ---------------------------------------------------------------------

    def allreduce(self, send_tensor: torch.Tensor, recv_tensor: torch.Tensor,
                  op: str = "sum") -> None:
        """``recv = reduce_op(send over ranks)``; send and recv may be the same tensor.
        ``op`` is one of "sum", "min", "max", "prod", "avg" ("avg" is ncclAvg on NCCL >= 2.10,
        else a sum scaled by 1/size, floating dtypes only)."""
        nccl_op, post_scale = self._op(op, send_tensor)
        self._check(send_tensor, "send_tensor")
        if recv_tensor is not send_tensor:  # in place, the usual case: checked already
            self._check(recv_tensor, "recv_tensor", like=send_tensor)
            _same_numel(send_tensor, recv_tensor, 1, "recv_tensor", "send_tensor")
        self._call("allreduce", self._comm.allReduce, send_tensor.data_ptr(),
                   recv_tensor.data_ptr(), send_tensor.numel(),
                   self._dtypes[send_tensor.dtype], nccl_op)
        self._finish_avg(recv_tensor, post_scale)

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> None:
        """Copy ``tensor`` of rank ``root`` into ``tensor`` on every rank, in place."""
        if not isinstance(root, int) or not 0 <= root < self.size:
            raise ValueError(f"root must be an int in [0, {self.size}), got {root!r}")
        self._check(tensor, "tensor")
        self._call("broadcast", self._comm.broadcast, tensor.data_ptr(), tensor.data_ptr(),
                   tensor.numel(), self._dtypes[tensor.dtype], root)

    def allgather(self, send: torch.Tensor, recv: torch.Tensor) -> None:
        """``recv`` (``size * send.numel()`` elements) receives every rank's ``send`` in
        rank order."""
        self._check(send, "send")
        self._check(recv, "recv", like=send)
        _same_numel(send, recv, self.size, "recv", "send")
        self._call("allgather", self._comm.allGather, send.data_ptr(), recv.data_ptr(),
                   send.numel(), self._dtypes[send.dtype])

    def reduce_scatter(self, send: torch.Tensor, recv: torch.Tensor, op: str = "sum") -> None:
        """Reduce ``send`` (``size * recv.numel()`` elements) over ranks; rank ``r`` gets
        block ``r`` of the result in ``recv``. Ops as in :meth:`allreduce`."""
        nccl_op, post_scale = self._op(op, send)
        self._check(send, "send")
        self._check(recv, "recv", like=send)
        _same_numel(recv, send, self.size, "send", "recv")
        self._call("reduce_scatter", self._comm.reduceScatter, send.data_ptr(),
                   recv.data_ptr(), recv.numel(), self._dtypes[send.dtype], nccl_op)
        self._finish_avg(recv, post_scale)

    def close(self) -> None:
        """Release the NCCL communicator (idempotent). Pending work on the stream must be
        finished or abandoned by the caller first."""
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None:
            comm.destroy()
        if getattr(self, "watchdog", None) is not None:
            self.watchdog.forget(self)

    def abort(self) -> None:
        """``ncclCommAbort``: pending operations return unfinished and the communicator is
        gone (the watchdog calls this past an operation's deadline)."""
        comm, self._comm = getattr(self, "_comm", None), None
        if comm is not None:
            comm.abort()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- helpers -------------------------------------------------------------------------

    def _op(self, op: str, tensor: torch.Tensor):
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, got {op!r}")
        if tensor.dtype == torch.bool and op not in ("min", "max"):
            raise ValueError(f"op={op!r} is not defined for bool tensors; use 'max' (any) "
                             f"or 'min' (all)")
        if op in self._ops:
            return self._ops[op], None
        # avg without ncclAvg: sum, then scale by 1/size.
        if not tensor.is_floating_point():
            raise ValueError(f"op='avg' on {tensor.dtype} needs NCCL >= 2.10 (ncclAvg); "
                             f"use op='sum' and divide")
        return self._ops["sum"], 1.0 / self.size

    def _finish_avg(self, tensor: torch.Tensor, post_scale: Optional[float]) -> None:
        if post_scale is not None:
            from ripples.kernels import scale_
            scale_(tensor, post_scale)

    def _check(self, tensor, name: str, like: Optional[torch.Tensor] = None) -> None:
        if self.watchdog is not None:
            self.watchdog.raise_if_failed(self)
        if self._comm is None:
            raise RipplesError("NcclCommunicator is closed")
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(tensor).__name__}")
        if tensor.device != self.device:
            raise ValueError(f"{name} is on {tensor.device}, the communicator on "
                             f"{self.device}; move it with .to({str(self.device)!r})")
        if not tensor.is_contiguous():
            raise ValueError(f"{name} must be contiguous; pass {name}.contiguous() and "
                             f"copy the result back")
        if tensor.dtype not in self._dtypes:
            raise TypeError(f"{name} has dtype {tensor.dtype}, which this NCCL does not "
                            f"support; supported: {sorted(str(d) for d in self._dtypes)}")
        if like is not None and tensor.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {tensor.dtype} but must match {like.dtype}")

    def _call(self, what: str, fn, *args) -> None:
        stream = current_stream_handle(self.device.index)
        dog = self.watchdog
        if dog is not None:
            began, done = dog.reusable_events(self) or (CudaEvent(self.device.index),
                                                        CudaEvent(self.device.index))
            began.record(stream)
        try:
            fn(*args, stream)
        except self._nccl.NcclError as exc:
            raise RipplesError(f"NCCL {what} failed on rank {self.rank} of {self.size}: "
                               f"{exc}") from exc
        if dog is not None:
            done.record(stream)
            dog.track(what, self, self.label, began, done, self.abort)


def ranks_sharing_a_gpu(places: list) -> Optional[tuple]:
    """The first two ranks (by rank) whose ``places`` (host, GPU) are equal, or None."""
    seen: dict = {}
    for rank, place in enumerate(places):
        if place in seen:
            return seen[place], rank
        seen[place] = rank
    return None


def _gpu_place(device: torch.device) -> tuple:
    """Where ``device`` is: this host's name and the GPU's UUID (its index where torch gives
    no UUID), so that two processes' views of one GPU compare equal."""
    properties = torch.cuda.get_device_properties(device)
    return socket.gethostname(), str(getattr(properties, "uuid", device.index))


def _as_cuda_device(device) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int):
        return torch.device("cuda", device)
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"device must be a CUDA device, got {device}")
    return torch.device("cuda", device.index if device.index is not None
                        else torch.cuda.current_device())


def _same_numel(small: torch.Tensor, large: torch.Tensor, factor: int,
                large_name: str, small_name: str) -> None:
    if large.numel() != small.numel() * factor:
        raise ValueError(f"{large_name} must have {factor} x {small_name}.numel() = "
                         f"{small.numel() * factor} elements, got {large.numel()}")
