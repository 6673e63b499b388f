"""Transparent huge pages: a 4 MiB raw all-reduce on numpy- against torch-allocated
memory, next to ``numpy.copyto`` bandwidth of the same buffers (``--memory``)."""
from __future__ import annotations

from typing import Optional, Tuple

import numpy as np
import torch
from mpi4py import MPI

from .context import Context
from .options import ITEMSIZE, MEMORY_BYTES
from .plugins import AllreducePlugin
from .sweep import alternating, gather_rounds, gbps, slowest


def anon_huge_kb() -> Optional[int]:
    """This process's transparent huge page memory in kB (Linux), None where unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _allocate(kind: str, count: int) -> Tuple[np.ndarray, Optional[int]]:
    """A zeroed float32 buffer from numpy or torch, and the huge-page kB it added."""
    before = anon_huge_kb()
    buf = np.zeros(count, np.float32) if kind == "numpy" else torch.zeros(count).numpy()
    buf[:] = 0.0  # write every page so the kernel backs it now (zeros keep sums finite)
    after = anon_huge_kb()
    return buf, (after - before if before is not None and after is not None else None)


def memory_effect(ctx: Context, iters: int, rounds: int) -> Optional[dict]:
    """4 MiB in-place raw Allreduce over the world on numpy- vs torch-allocated memory, and
    ``numpy.copyto`` bandwidth of the same buffers (all ranks copy at once). numpy advises
    the kernel to use transparent huge pages for arrays of 4 MiB and more; torch does not."""
    count = MEMORY_BYTES // ITEMSIZE
    buffers, huge_kb = {}, {}
    for kind in ("numpy", "torch"):
        (a, huge_a), (b, huge_b) = _allocate(kind, count), _allocate(kind, count)
        buffers[kind] = (a, b)
        huge_kb[kind] = None if huge_a is None or huge_b is None else huge_a + huge_b
    results = {}
    for kind, (a, b) in buffers.items():
        def reduce(buf=a):
            ctx.bench.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        def copy(src=a, dst=b):
            np.copyto(dst, src)
        for _ in range(3):
            reduce()
            copy()
        mine = alternating(ctx, reduce, copy, iters, rounds)  # "ripples" = reduce, "raw" = copy
        gathered = gather_rounds(ctx, mine)
        if ctx.rank == 0:
            t = slowest(gathered["ripples"], range(ctx.size))
            c = slowest(gathered["raw"], range(ctx.size))
            busbw = gbps(MEMORY_BYTES, t) * AllreducePlugin.factor(ctx.size)
            results[kind] = {"allreduce_us": t * 1e6, "busbw": busbw,
                             "huge_page_kb_rank0": huge_kb[kind],
                             "memcpy_us": c * 1e6, "memcpy_gbps": gbps(MEMORY_BYTES, c),
                             "busbw_over_memcpy": busbw / gbps(MEMORY_BYTES, c)}
    if ctx.rank != 0:
        return None
    results["bytes"] = MEMORY_BYTES
    results["torch_over_numpy_time"] = (results["torch"]["allreduce_us"]
                                        / results["numpy"]["allreduce_us"])
    return results

