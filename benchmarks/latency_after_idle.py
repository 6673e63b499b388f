"""What one collective costs when it follows a step of (emulated) compute, as in training.

    mpiexec -n 8 --oversubscribe python benchmarks/latency_after_idle.py \\
        --json benchmarks/results/latency_after_idle_np8.json

``benchmarks/collectives.py`` times collectives back to back. In ``benchmarks/train.py``
each collective instead follows ``--compute-ms`` of sleep: every rank's threads have gone
idle, and with more ranks than cores they wake up and compete for the cores at once. This
benchmark measures that cost, the one the simulator's ``this-machine`` preset needs.

Every iteration: a barrier, ``--idle-ms`` of sleep, then one timed operation on a buffer
of ``--bytes`` (default: the 8,970 float32 parameters of ``benchmarks/train.py``'s MLP).
An iteration's time is the slowest rank's; the medians over ``--iterations`` are printed
and written as JSON. Rows (interleaved, one iteration of each in turn):

- ``raw MPI allreduce (world)``: mpi4py ``Allreduce`` over all ranks;
- ``raw MPI allreduce (group)``: the same over disjoint groups of ``--group-size`` ranks
  (``Split`` communicators, every group at once);
- ``ripples allreduce``: ``ripples.torch.allreduce_`` over all ranks;
- ``ripples partial_allreduce``: ``grouped_partial_allreduce_`` over the same groups;
- ``generator request``: one ``groups_for_step`` of the Group Generator service with the
  ``"all"`` policy, which answers at once (no waiting for other ranks to be ready): the
  round trip of a request, its doorbell and the service thread's wake-up;
- ``AD-PSGD exchange``: each even rank, active, averages with the next odd rank, passive,
  whose responder thread answers (``ripples.torch.adpsgd_exchange``); timed on the active
  ranks, while the passive ones sleep as if computing. The responder sleeps on a doorbell
  that the active rank rings, as in ``sync="adpsgd"``;
- ``AD-PSGD exchange (naps)``: the same with a responder that naps between polls (up to
  1 ms), as it does where no doorbell could be made.

Compute is EMULATED (sleep). No bar: these numbers are inputs of the simulator.
"""
from __future__ import annotations

import argparse
import threading
import time

import torch
from mpi4py import MPI

import ripples.torch as hvd
from harness import report, stats, timing
from ripples.ops.partial import grouped_partial_allreduce_
from ripples.schedule.service import GeneratorSchedule
from ripples.comm.doorbell import Doorbell
from ripples.torch.adpsgd_exchange import Responder, exchange, finish

ROWS = ("raw MPI allreduce (world)", "raw MPI allreduce (group)", "ripples allreduce",
        "ripples partial_allreduce", "generator request", "AD-PSGD exchange",
        "AD-PSGD exchange (naps)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--idle-ms", type=float, default=50.0, help="sleep before each operation")
    p.add_argument("--bytes", type=int, default=8970 * 4, help="buffer size (float32)")
    p.add_argument("--group-size", type=int, default=4, help="ranks per group")
    p.add_argument("--iterations", type=int, default=60, help="timed iterations per row")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations per row first")
    p.add_argument("--json", help="write the medians here (rank 0)")
    return p.parse_args(argv)


def operations(args, world):
    """``(calls, close)``: one callable per row, taking the iteration number, and what
    ends them all (collective)."""
    rank = world.Get_rank()
    first = rank - rank % args.group_size
    group = tuple(range(first, first + args.group_size))
    group_comm = world.Split(color=first, key=rank)
    buffer = torch.zeros(args.bytes // 4)
    array = buffer.numpy()
    schedule = GeneratorSchedule(world.Dup(), args.group_size, policy="all", free_comm=True)
    exchange_rung, close_rung = pair_exchanges(args, world, with_doorbell=True)
    exchange_napping, close_napping = pair_exchanges(args, world, with_doorbell=False)

    def close():
        schedule.close()
        close_rung()
        close_napping()
        group_comm.Free()

    calls = {
        ROWS[0]: lambda i: world.Allreduce(MPI.IN_PLACE, array),
        ROWS[1]: lambda i: group_comm.Allreduce(MPI.IN_PLACE, array),
        ROWS[2]: lambda i: hvd.allreduce_(buffer, name="idle", op=hvd.Sum),
        ROWS[3]: lambda i: grouped_partial_allreduce_([buffer], group),
        ROWS[4]: lambda i: schedule.groups_for_step(i),
        ROWS[5]: exchange_rung,
        ROWS[6]: exchange_napping,
    }
    return calls, close


def pair_exchanges(args, world, with_doorbell: bool):
    """``(call, close)`` of AD-PSGD exchanges between each even (active) rank and the next
    odd (passive) one, on a communicator of their own (collective)."""
    rank = world.Get_rank()
    pairs = world.Dup()
    active, partner = rank % 2 == 0, rank ^ 1
    passives = list(range(1, world.Get_size(), 2))
    doorbell = Doorbell.setup_many(pairs, passives) if with_doorbell else None
    if with_doorbell and doorbell is None:
        raise SystemExit("no doorbell could be made on this machine")
    exchanged = torch.zeros(args.bytes // 4)
    responder = None
    if not active:
        responder = Responder(pairs, rank, [partner], threading.Lock(), lambda: [exchanged],
                              lambda _: None, timeout_s=60.0, stall_s=60.0, doorbell=doorbell)
        responder.start()

    def call(i):
        if active:
            exchange(pairs, rank, partner, [exchanged], i, timeout_s=60.0, stall_s=60.0,
                     doorbell=doorbell)

    def close():
        if active:
            finish(pairs, rank, [partner], args.warmup + args.iterations, 60.0, 60.0, doorbell)
        else:
            responder.wait()
        if doorbell is not None:
            doorbell.close()
        pairs.Free()

    return call, close


def main(argv=None) -> int:
    args = parse_args(argv)
    hvd.init()
    world = MPI.COMM_WORLD
    size = world.Get_size()
    if size % args.group_size or size % 2:
        raise SystemExit(f"--group-size {args.group_size} and 2 must divide the {size} ranks")
    calls, close = operations(args, world)

    def idle(_):  # untimed: every rank idles at once, as after a step of compute
        world.Barrier()
        time.sleep(args.idle_ms / 1000.0)

    times = timing.interleaved(calls, args.iterations, warmup=args.warmup, before=idle)
    slowest = {row: stats.slowest_per_iteration(world.allgather(times[row])) for row in ROWS}
    close()
    if world.Get_rank() == 0:
        medians = {row: 1e6 * stats.median(slowest[row]) for row in ROWS}
        print(f"{size} ranks, {args.idle_ms:g} ms idle before each operation (emulated "
              f"compute), {args.bytes} bytes, groups of {args.group_size}; median of "
              f"{args.iterations}, slowest rank")
        for row in ROWS:
            print(f"  {row:<28} {medians[row]:8.0f} us")
        if args.json:
            report.write_json(args.json, {"ranks": size, "compute": "emulated (sleep)",
                                          "args": vars(args), "median_us": medians})
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
