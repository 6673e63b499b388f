"""Microbenchmark: a float32 all-reduce against the 16-bit ones of the same element count.

    mpiexec -n 2 python benchmarks/half_allreduce.py [--numel 1200000] [--repeats 20] [--json PATH]

Rows: mpi4py ``Allreduce`` of float32 (4 bytes per element on the wire), of float16 with
Open MPI's ``MPI.FLOAT16_T`` (the ``shortfloat`` extension, when present), and
``ripples.ops.half_allreduce.allreduce_16bit_`` for float16 and bfloat16. Each call starts
after a barrier; rank 0 prints the median time of ``--repeats`` calls after 3 warm-up
calls (and writes them to ``--json PATH``). A rough measurement: run it on a quiet machine
and repeat it.
"""
from __future__ import annotations

import argparse

import torch
from mpi4py import MPI

from harness import report, stats, timing
from ripples.comm.mpi import as_buffer
from ripples.ops.half_allreduce import allreduce_16bit_


def timed(comm, call, repeats: int) -> float:
    """Median seconds of ``call()`` over ``repeats`` calls after 3 warm-up calls, each
    after a barrier."""
    times = timing.interleaved({"call": lambda _: call()}, repeats, warmup=3,
                               before=lambda _: comm.Barrier())
    return stats.median(times["call"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--numel", type=int, default=1_200_000)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--json", help="write the medians here (rank 0)")
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
    median_us = {}
    for label, call in rows:
        median_us[label] = timed(comm, call, args.repeats) * 1e6
        if comm.Get_rank() == 0:
            print(f"{label:40s} {median_us[label] / 1e3:8.2f} ms", flush=True)
    if args.json and comm.Get_rank() == 0:
        report.write_json(args.json, {"ranks": comm.Get_size(), "compute": "none",
                                      "args": vars(args), "median_us": median_us})


if __name__ == "__main__":
    main()
