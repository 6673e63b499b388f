#!/usr/bin/env python
"""Collectives micro-benchmark in the style of nccl-tests: ripples side by side with raw MPI.

Run it under MPI, for example::

    mpiexec -n 4 --oversubscribe python benchmarks/collectives.py -b 8 -e 16M -f 4 -g 2 --split

For every collective and size it times the ripples call and the same collective issued
directly through mpi4py on the same ranks and the same kind of memory. The two are measured
in alternating blocks of ``-n`` iterations (``--rounds`` rounds, alternating which goes
first) and the medians over rounds are compared, so that noise on a shared machine hits
both alike. A block's time is the slowest participating rank's.

Columns follow nccl-tests: ``algbw = size / time``; ``busbw = algbw * factor`` with factor
``2(g-1)/g`` for an all-reduce over g ranks, ``(g-1)/g`` for allgather (size = gathered
bytes) and 1 for broadcast. ``ref(us)`` and ``ref_busbw`` are the raw mpi4py measurement,
``ratio`` is ripples throughput over raw throughput (raw time / ripples time).

Also reported: the latency ripples adds at sizes <= 64 KB on a cached group, the cost of the
first ``partial_allreduce`` on a group whose communicator is not cached (``--miss-samples``),
and with ``--memory`` the effect of transparent huge pages on a 4 MiB all-reduce
(numpy-allocated versus torch-allocated memory) next to ``numpy.copyto`` bandwidth. The bars
of BENCHMARKS.md are printed as PASS/MISS; they are reports, not assertions.

Rank 0 prints the table and writes ``--json PATH``. There is no compute in this benchmark:
it is pure communication.
"""
from __future__ import annotations

import os
import sys
from typing import Optional, Sequence

from mpi4py import MPI

import ripples.torch as hvd
from collectives.cache_miss import cache_miss
from collectives.context import Context
from collectives.memory import memory_effect
from collectives.options import build_parser, check_args, parse_ops, parse_size, size_sweep
from collectives.plugins import PLUGINS
from collectives.report import bars, header_info, print_report
from collectives.sweep import measure
from harness import report


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser(__doc__.split("\n\n")[0]).parse_args(argv)
    hvd.init()
    check_args(args, MPI.COMM_WORLD.Get_size())
    sizes = size_sweep(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    ops = parse_ops(args.ops)
    ctx = Context(args)
    load_before = os.getloadavg()
    # First, while the heap is fresh: once large buffers have been freed, glibc serves later
    # 4 MiB requests from already-mapped small pages and numpy's huge-page advice is moot.
    memory = memory_effect(ctx, args.iters, args.rounds) if args.memory else None
    rows = []
    for op in ops:
        for nbytes in sizes:
            row = measure(ctx, PLUGINS[op](ctx, nbytes), args)
            if row is not None:
                rows.append(row)
    miss = cache_miss(ctx, args.miss_samples) if ("partial_allreduce" in ops
                                                   and args.miss_samples) else None
    if ctx.rank == 0:
        info = header_info(ctx, load_before)
        results_bars = bars(rows, miss)
        print_report(info, args, rows, miss, memory, results_bars)
        if args.json:
            settings = {k: getattr(args, k) for k in vars(args)}
            settings["sizes"] = sizes
            report.write_json(args.json, {"header": info, "settings": settings, "rows": rows,
                                          "cache_miss": miss, "memory": memory,
                                          "bars": results_bars}, info["command"])
    ctx.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
