"""One plug-in per collective, as nccl-tests keeps one file per collective. A plug-in
holds its buffers for one size and exposes ``ripples()``, ``raw()`` (the same collective
through mpi4py on the same ranks) and ``check(which)``: the number of wrong elements of
one fresh call (``which`` = ``"ripples"`` or ``"raw"``). ``factor(g)`` is nccl-tests' bus
bandwidth factor over ``g`` ranks."""
from __future__ import annotations

from typing import Tuple

import torch
from mpi4py import MPI

import ripples.torch as hvd

from .context import Context, pattern
from .options import ITEMSIZE


class _Plugin:
    name = ""
    redop = "none"
    group: Tuple[int, ...] = ()
    comm = None

    def member(self, rank: int) -> bool:
        return rank in self.group

    @staticmethod
    def factor(g: int) -> float:
        raise NotImplementedError


class AllreducePlugin(_Plugin):
    """``hvd.allreduce_(t, op=Sum)`` against ``Allreduce(IN_PLACE)`` on a Dup of the world."""
    name = "allreduce"
    redop = "sum"

    def __init__(self, ctx: Context, nbytes: int):
        self.ctx = ctx
        self.group, self.comm = self._where(ctx)
        self.count = max(1, nbytes // ITEMSIZE)
        self.nbytes = self.count * ITEMSIZE
        # Zeros while timing: repeated in-place sums stay finite.
        self.tensor = torch.zeros(self.count)
        self.ref = torch.zeros(self.count).numpy()

    def _where(self, ctx):
        return ctx.world_group, ctx.bench

    @staticmethod
    def factor(g: int) -> float:
        return 2 * (g - 1) / g if g > 1 else 0.0

    def ripples(self) -> None:
        hvd.allreduce_(self.tensor, op=hvd.Sum)

    def raw(self) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, self.ref, op=MPI.SUM)

    def check(self, which: str) -> int:
        data = pattern(self.count, self.ctx.rank + 1)
        if which == "ripples":
            self._ripples_on(data)
        else:
            buf = data.numpy()
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        expected = pattern(self.count, sum(r + 1 for r in self.group))
        return int((data != expected).sum())

    def _ripples_on(self, data: torch.Tensor) -> None:
        hvd.allreduce_(data, op=hvd.Sum)


class PartialAllreducePlugin(AllreducePlugin):
    """``hvd.partial_allreduce_(t, group, op=Sum)`` against raw ``Allreduce`` on a
    sub-communicator of the same ranks made once with ``Create_group``."""
    name = "partial_allreduce"

    def _where(self, ctx):
        return (ctx.part_group or ()), ctx.part_comm

    def ripples(self) -> None:
        hvd.partial_allreduce_(self.tensor, self.group, op=hvd.Sum)

    def _ripples_on(self, data: torch.Tensor) -> None:
        hvd.partial_allreduce_(data, self.group, op=hvd.Sum)


class AllgatherPlugin(_Plugin):
    """``hvd.allgather(t)`` against raw ``Allgather``; size is the gathered total."""
    name = "allgather"

    def __init__(self, ctx: Context, nbytes: int):
        self.ctx = ctx
        self.group, self.comm = ctx.world_group, ctx.bench
        g = len(self.group)
        self.per_rank = max(1, nbytes // (ITEMSIZE * g))
        self.count = self.per_rank * g
        self.nbytes = self.count * ITEMSIZE
        self.tensor = torch.zeros(self.per_rank)
        self.send = torch.zeros(self.per_rank).numpy()
        self.recv = torch.zeros(self.count).numpy()

    @staticmethod
    def factor(g: int) -> float:
        return (g - 1) / g

    def ripples(self) -> None:
        hvd.allgather(self.tensor)

    def raw(self) -> None:
        self.comm.Allgather(self.send, self.recv)

    def check(self, which: str) -> int:
        send = pattern(self.per_rank, self.ctx.rank + 1)
        if which == "ripples":
            out = hvd.allgather(send)
        else:
            out = torch.zeros(self.count)
            self.comm.Allgather(send.numpy(), out.numpy())
        expected = torch.cat([pattern(self.per_rank, r + 1) for r in self.group])
        if out.shape != expected.shape:
            return self.count
        return int((out != expected).sum())


class BroadcastPlugin(_Plugin):
    """``hvd.broadcast_(t, 0)`` against raw ``Bcast`` from rank 0."""
    name = "broadcast"

    def __init__(self, ctx: Context, nbytes: int):
        self.ctx = ctx
        self.group, self.comm = ctx.world_group, ctx.bench
        self.count = max(1, nbytes // ITEMSIZE)
        self.nbytes = self.count * ITEMSIZE
        self.tensor = torch.zeros(self.count)
        self.ref = torch.zeros(self.count).numpy()

    @staticmethod
    def factor(g: int) -> float:
        return 1.0

    def ripples(self) -> None:
        hvd.broadcast_(self.tensor, 0)

    def raw(self) -> None:
        self.comm.Bcast(self.ref, root=0)

    def check(self, which: str) -> int:
        data = pattern(self.count, 3) if self.ctx.rank == 0 else torch.zeros(self.count)
        if which == "ripples":
            hvd.broadcast_(data, 0)
        else:
            self.comm.Bcast(data.numpy(), root=0)
        return int((data != pattern(self.count, 3)).sum())


PLUGINS = {p.name: p for p in (AllreducePlugin, PartialAllreducePlugin, AllgatherPlugin,
                                BroadcastPlugin)}
