"""Microbenchmark: a float32 all-reduce against the 16-bit ones of the same element count.

    mpiexec -n 2 python benchmarks/half_allreduce.py [--numel 1200000] [--repeats 20]

Rows: mpi4py ``Allreduce`` of float32 (4 bytes per element on the wire), of float16 with
Open MPI's ``MPI.FLOAT16_T`` (the ``shortfloat`` extension, when present), and
``ripples.ops.half_allreduce.allreduce_16bit_`` for float16 and bfloat16. Each call starts
after a barrier; rank 0 prints the median time of ``--repeats`` calls after 3 warm-up
calls. A rough measurement: run it on a quiet machine and repeat it.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from mpi4py import MPI

from ripples.comm.mpi import as_buffer
from ripples.ops.half_allreduce import allreduce_16bit_


def timed(comm, call, repeats: int) -> float:
    """Median seconds of ``call()`` over ``repeats`` calls, each after a barrier."""
    for _ in range(3):
        call()
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=1_200_000)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    comm = MPI.COMM_WORLD
    torch.manual_seed(comm.Get_rank())
    values = torch.randn(args.numel)
    fp32, fp16, bf16 = values.clone(), values.half(), values.bfloat16()
    rows = [(f"float32 Allreduce ({fp32.numel() * 4 / 1e6:.1f} MB)",
             lambda: comm.Allreduce(MPI.IN_PLACE, as_buffer(fp32), op=MPI.SUM))]
    if MPI.FLOAT16_T != MPI.DATATYPE_NULL:
        rows.append(("float16 Allreduce, MPI.FLOAT16_T", lambda: comm.Allreduce(
            MPI.IN_PLACE, [fp16.numpy(), MPI.FLOAT16_T], op=MPI.SUM)))
    rows += [("float16 allreduce_16bit_", lambda: allreduce_16bit_(comm, fp16)),
             ("bfloat16 allreduce_16bit_", lambda: allreduce_16bit_(comm, bf16))]
    for label, call in rows:
        seconds = timed(comm, call, args.repeats)
        if comm.Get_rank() == 0:
            print(f"{label:40s} {seconds * 1e3:8.2f} ms", flush=True)


if __name__ == "__main__":
    main()
