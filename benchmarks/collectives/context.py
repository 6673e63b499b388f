"""The ranks' benchmark communicators and the integer-valued test data."""
from __future__ import annotations

from typing import Optional, Tuple

import torch
from mpi4py import MPI


class Context:
    """The ranks' benchmark communicators, built once before any measurement.

    ``bench`` is a duplicate of the world used for barriers, timing reductions and raw
    world collectives; ``part_comm`` is the raw sub-communicator of this rank's
    partial_allreduce group (None when this rank is in no group).
    """

    def __init__(self, args):
        world = MPI.COMM_WORLD
        self.rank = world.Get_rank()
        self.size = world.Get_size()
        self.bench = world.Dup()
        self.world_group = tuple(range(self.size))
        g = args.group
        if args.split:
            self.part_groups = [tuple(range(s, s + g)) for s in range(0, self.size, g)]
        else:
            self.part_groups = [tuple(range(g))]
        mine = [grp for grp in self.part_groups if self.rank in grp]
        self.part_group: Optional[Tuple[int, ...]] = mine[0] if mine else None
        self.part_comm = None
        if self.part_group is not None:
            mpi_group = self.bench.Get_group().Incl(list(self.part_group))
            self.part_comm = self.bench.Create_group(mpi_group)
            mpi_group.Free()

    def close(self) -> None:
        if self.part_comm is not None:
            self.part_comm.Free()
        self.bench.Free()


def pattern(count: int, scale: int) -> torch.Tensor:
    """Integer-valued float32 data ``scale * (i % 7 + 1)``: sums of it are exact."""
    return (torch.arange(count, dtype=torch.int64) % 7 + 1).to(torch.float32) * scale

