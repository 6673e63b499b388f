"""The native lane against raw MPI and against the Python path, side by side in one run.

    mpiexec -n 2 --oversubscribe python benchmarks/native_lane.py \\
        --json benchmarks/results/native_lane_np2.json

Rows, interleaved (one iteration of each in turn, every rank at once):

- ``raw``: mpi4py ``Allreduce`` in place on a duplicate of the world (``allreduce``) or
  on a ``Split`` communicator of disjoint pairs of ranks (``partial_allreduce``); into a
  new tensor for ``allreduce, new tensor``;
- ``raw avg``: the same, then ``torch.mul_`` by 1/n: the work of an Average done by hand;
- ``lane on``: ``ripples.torch.allreduce_`` / ``partial_allreduce_`` / ``allreduce`` (op
  Average) once their call shape is planned;
- ``lane sum``: the same with op Sum: the same work as ``raw``;
- ``lane off``: the same calls with the lanes paused (``Lanes.pause``): the Python path,
  as with ``RIPPLES_NATIVE_LANE=0``.

Scenarios: ``after idle`` (a barrier, ``--idle-ms`` of sleep as after a step of compute,
then one timed call of ``--bytes``; an iteration's time is the slowest rank's); ``back to
back`` (``--burst`` calls of ``--small-bytes`` in a row, time per call); ``large`` (the same
with ``--large-bytes``). Medians over ``--iterations``. Raw MPI's Average is a Sum: the
rows of ripples with op Average include the scaling by 1/n, as does ``raw avg`` (their
``on/avg`` column); ``sum/raw`` compares like with like.
Compute is EMULATED (sleep).

Bars (BENCHMARKS.md): after idle <= 1.3x raw; back to back <= 5 us added; >= 1 MiB
>= 0.97x raw throughput.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time

import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples.ops import native_lane
from ripples.runtime import current

SCENARIOS = ("after idle", "back to back", "large")
KINDS = ("allreduce", "partial_allreduce", "allreduce, new tensor")
MODES = ("raw", "raw avg", "lane on", "lane sum", "lane off")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--idle-ms", type=float, default=20.0)
    p.add_argument("--bytes", type=int, default=36 * 1024, help="after idle")
    p.add_argument("--small-bytes", type=int, default=256, help="back to back")
    p.add_argument("--large-bytes", type=int, default=1 << 20, help="large")
    p.add_argument("--burst", type=int, default=50, help="calls per back-to-back iteration")
    p.add_argument("--large-burst", type=int, default=5, help="calls per large iteration")
    p.add_argument("--iterations", type=int, default=30)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--json", help="write the medians here (rank 0)")
    return p.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    hvd.init()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    if size % 2:
        raise SystemExit("run on an even number of ranks (pairs for partial_allreduce)")
    lanes = current().engine.lanes
    dup = world.Dup()
    first = rank - rank % 2
    pair = (first, first + 1)
    pair_comm = world.Split(color=first, key=rank)
    sizes = {"after idle": args.bytes, "back to back": args.small_bytes,
             "large": args.large_bytes}
    buffers = {s: torch.ones(n // 4) for s, n in sizes.items()}

    def call(kind, mode, tensor):
        if mode in ("raw", "raw avg"):
            comm = pair_comm if kind == "partial_allreduce" else dup
            if kind == "allreduce, new tensor":
                result = torch.empty_like(tensor)
                comm.Allreduce(tensor.numpy(), result.numpy())
                tensor = result
            else:
                comm.Allreduce(MPI.IN_PLACE, tensor.numpy())
            if mode == "raw avg":
                tensor.mul_(1.0 / comm.Get_size())
            return
        lanes.pause(mode == "lane off")
        op, name = ((hvd.Sum, f"bench.sum.{tensor.numel()}") if mode == "lane sum"
                    else (hvd.Average, f"bench.{tensor.numel()}"))
        if kind == "allreduce":
            hvd.allreduce_(tensor, name=name, op=op)
        elif kind == "allreduce, new tensor":
            hvd.allreduce(tensor, name=name + ".new", op=op)
        else:
            hvd.partial_allreduce_(tensor, pair, name=name, op=op)
        lanes.pause(False)

    times = {(s, k, m): [] for s in SCENARIOS for k in KINDS for m in MODES}
    for iteration in range(args.warmup + args.iterations):
        for scenario in SCENARIOS:
            tensor = buffers[scenario]
            calls = {"after idle": 1, "back to back": args.burst,
                     "large": args.large_burst}[scenario]
            for kind in KINDS:
                for mode in MODES:
                    world.Barrier()
                    if scenario == "after idle":
                        time.sleep(args.idle_ms / 1000.0)
                    start = time.perf_counter()
                    for _ in range(calls):
                        call(kind, mode, tensor)
                    elapsed = (time.perf_counter() - start) / calls
                    if iteration >= args.warmup:
                        times[(scenario, kind, mode)].append(elapsed)
    gathered = {key: world.allgather(value) for key, value in times.items()}
    if rank == 0:
        medians = {key: 1e6 * statistics.median(max(per_rank[r][i] for r in range(size))
                                                for i in range(args.iterations))
                   for key, per_rank in gathered.items()}
        rows = []
        print(f"{size} ranks; native lane: {native_lane.status()}; medians of "
              f"{args.iterations}, slowest rank; compute EMULATED (sleep)")
        print(f"{'scenario':<13} {'collective':<22} {'bytes':>8} {'raw us':>9} {'avg us':>9} "
              f"{'on us':>9} {'sum us':>9} {'off us':>9} {'on/raw':>7} {'on/avg':>7} "
              f"{'sum/raw':>7} {'off/raw':>7} {'sum-raw':>8}")
        for scenario in SCENARIOS:
            for kind in KINDS:
                raw, avg, on, total, off = (medians[(scenario, kind, m)] for m in MODES)
                rows.append({"scenario": scenario, "collective": kind,
                             "bytes": sizes[scenario], "raw_us": raw, "raw_avg_us": avg,
                             "lane_on_us": on, "lane_sum_us": total, "lane_off_us": off,
                             "on_over_raw": on / raw, "on_over_raw_avg": on / avg,
                             "sum_over_raw": total / raw, "off_over_raw": off / raw,
                             "on_added_us": on - raw, "sum_added_us": total - raw})
                print(f"{scenario:<13} {kind:<22} {sizes[scenario]:>8} {raw:9.1f} {avg:9.1f} "
                      f"{on:9.1f} {total:9.1f} {off:9.1f} {on / raw:7.2f} {on / avg:7.2f} "
                      f"{total / raw:7.2f} {off / raw:7.2f} {total - raw:8.1f}")
        if args.json:
            result = {"command": " ".join(["mpiexec", "-n", str(size), "python"] + sys.argv),
                      "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                          timespec="seconds"),
                      "machine": f"{platform.node()} ({platform.machine()}, "
                                 f"{os.cpu_count()} cores, no GPU)",
                      "ranks": size, "compute": "emulated (sleep)",
                      "native_lane": native_lane.status(), "args": vars(args), "rows": rows}
            with open(args.json, "w") as out:
                json.dump(result, out, indent=2)
    pair_comm.Free()
    dup.Free()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
