"""The links of the emulated cluster measured with raw mpi4py: the numbers the simulator's
network model takes, measured apart from any training run.

    netcluster up 4 --slots 2 --bw 1gbit
    python benchmarks/link.py --np 8 --netcluster --json benchmarks/results/link_hosts4x2_1gbit.json

Ping-pong between rank 0 and a rank on another host (inter-node link) and on its own host
(intra-node), over a sweep of sizes: the one-way time of the smallest message is the link's
latency, the slope between the two largest its bandwidth. Then, as a check of the network
model (not an input to it), plain ``MPI.Allreduce`` of ``--model-mb`` among all ranks, among
one rank per host, among the ranks of each host (every host at once) and between two ranks
on two hosts (the others idle; ``benchmarks/sim_hosts.py`` takes it for the bandwidth of a
two-member group across hosts); and the rate of
one stream of ``--model-mb`` from a rank of each host to the next host, alone and with every
host sending at once (do the links stay independent when all carry traffic?). And the
ring schedule ripples runs instead of ``MPI.Allreduce`` from 256 KiB across hosts, over
``Sendrecv`` among all ranks, between two ranks on two hosts, and among the ranks of each
host, every host at once (``ring_s``; ripples runs it within a host from 16 MiB: its
additions and copies share the cores with every other rank, which a ping-pong on an idle
host does not see). Pure
communication (the ring's additions aside). Without ``--netcluster`` the job runs on this host.
"""
from __future__ import annotations

import argparse
import sys
import time

from harness import launch, report, stats

SIZES = [8, 1 << 16, 1 << 20, 1 << 22, 1 << 24]


def pingpong(comm, peer_a: int, peer_b: int, nbytes: int, iterations: int) -> float:
    """Median one-way seconds of ``nbytes`` between ``peer_a`` and ``peer_b`` (others wait)."""
    import numpy as np
    buf = np.zeros(max(nbytes, 1), dtype=np.uint8)
    rank, times = comm.Get_rank(), []
    for _ in range(iterations + 1):
        comm.Barrier()
        start = time.perf_counter()
        if rank == peer_a:
            comm.Send(buf, peer_b)
            comm.Recv(buf, peer_b)
        elif rank == peer_b:
            comm.Recv(buf, peer_a)
            comm.Send(buf, peer_a)
        times.append((time.perf_counter() - start) / 2)
    value = stats.median(times[1:]) if rank == peer_a else 0.0
    return comm.bcast(value, root=peer_a)


def allreduce_s(comm, groups, nbytes: int, iterations: int) -> float:
    """Median seconds (slowest rank) of ``MPI.Allreduce`` of ``nbytes`` float32 within each
    of ``groups`` at once; ranks in no group wait."""
    import numpy as np
    from mpi4py import MPI
    rank = comm.Get_rank()
    color = next((i for i, g in enumerate(groups) if rank in g), MPI.UNDEFINED)
    sub = comm.Split(color, rank)
    data = np.ones(nbytes // 4, dtype=np.float32)
    out = np.empty_like(data)
    times = []
    for _ in range(iterations + 1):
        comm.Barrier()
        start = time.perf_counter()
        if sub != MPI.COMM_NULL:
            sub.Allreduce(data, out)
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    if sub != MPI.COMM_NULL:
        sub.Free()
    return stats.median(times[1:])


def ring_s(comm, groups, nbytes: int, iterations: int) -> float:
    """``allreduce_s`` for ripples' ring schedule (``ring_allreduce_``) with each step one
    ``Sendrecv``: what ripples runs for a large all-reduce across hosts instead of
    ``MPI.Allreduce``."""
    import torch
    from mpi4py import MPI
    from ripples.ops.ring_allreduce import ring_allreduce_
    rank = comm.Get_rank()
    group = next((g for g in groups if rank in g), None)
    data = torch.ones(nbytes // 4)
    times = []
    for _ in range(iterations + 1):
        comm.Barrier()
        start = time.perf_counter()
        if group is not None:
            position = group.index(rank)
            following, preceding = (group[(position + d) % len(group)] for d in (1, -1))
            ring_allreduce_(data, position, len(group), lambda _, send, receive: comm.Sendrecv(
                send.numpy(), dest=following, recvbuf=receive.numpy(), source=preceding),
                torch.add)
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return stats.median(times[1:])


def streams_gbps(comm, senders, per_host: int, nbytes: int, iterations: int) -> float:
    """Median rate (Gb/s, slowest stream) of one message of ``nbytes`` from each rank of
    ``senders`` (first ranks of hosts) to the first rank of the next host, all at once."""
    import numpy as np
    from mpi4py import MPI
    rank, size = comm.Get_rank(), comm.Get_size()
    buf = np.zeros(nbytes, dtype=np.uint8)
    source = (rank - per_host) % size
    times = []
    for _ in range(iterations + 1):
        comm.Barrier()
        start = time.perf_counter()
        requests = []
        if rank in senders:
            requests.append(comm.Isend(buf, (rank + per_host) % size))
        if source in senders and rank % per_host == 0:
            requests.append(comm.Irecv(np.empty_like(buf), source))
        MPI.Request.Waitall(requests)
        times.append(comm.allreduce(time.perf_counter() - start, op=MPI.MAX))
    return nbytes * 8 / 1e9 / stats.median(times[1:])


def worker(args) -> None:
    import socket
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    hosts = comm.allgather(socket.gethostname())
    per_host = hosts.count(hosts[0])
    other = per_host if per_host < size else None
    rows = {"intra": [], "inter": []}
    for nbytes in SIZES:
        if per_host > 1:
            rows["intra"].append((nbytes, pingpong(comm, 0, 1, nbytes, args.iterations)))
        if other is not None:
            rows["inter"].append((nbytes, pingpong(comm, 0, other, nbytes, args.iterations)))
    nbytes = int(args.model_mb * 1e6)
    nodes = [list(range(n, n + per_host)) for n in range(0, size, per_host)]
    checks = {"all ranks": [list(range(size))],
              "one rank per host": [[g[0] for g in nodes]],
              "each host's ranks, all hosts at once": nodes}
    if other is not None:  # the smallest group across hosts, as AD-PSGD's pairs and most
        checks["a pair across hosts"] = [[0, other]]  # of the generator's groups
    measured = {name: allreduce_s(comm, groups, nbytes, args.iterations)
                for name, groups in checks.items()}
    rings = {name: ring_s(comm, checks[name], nbytes, args.iterations)
             for name in ("all ranks", "a pair across hosts",
                          "each host's ranks, all hosts at once") if name in checks}
    firsts = [g[0] for g in nodes]
    streams = {} if len(nodes) < 2 else {
        "one stream alone": streams_gbps(comm, firsts[:1], per_host, nbytes, args.iterations),
        "every host at once": streams_gbps(comm, firsts, per_host, nbytes, args.iterations)}
    if rank == 0:
        result = {"hosts": hosts, "ranks_per_host": per_host, "model_mb": args.model_mb,
                  "compute": "none (pure communication)",
                  "links": {name: fit(points) for name, points in rows.items() if points},
                  "pingpong": rows, "allreduce_s": measured, "ring_s": rings,
                  "stream_gbps": streams,
                  "cluster": launch.cluster_status() if args.netcluster else None}
        for name, link in result["links"].items():
            print(f"{name}: latency {link['latency_us']:.0f} us, bandwidth "
                  f"{link['gbps']:.3f} Gb/s")
        for name, seconds in measured.items():
            print(f"MPI.Allreduce {args.model_mb:g} MB, {name}: {seconds * 1e3:.1f} ms")
        for name, seconds in rings.items():
            print(f"ring all-reduce {args.model_mb:g} MB, {name}: {seconds * 1e3:.1f} ms")
        for name, gbps in streams.items():
            print(f"{args.model_mb:g} MB stream to the next host, {name}: {gbps:.3f} Gb/s")
        if args.json:
            report.write_json(args.json, result)


def fit(points) -> dict:
    """Latency (one-way time of the smallest message) and bandwidth (slope between the two
    largest) of a ping-pong sweep."""
    (_, t_small), (b1, t1), (b2, t2) = points[0], points[-2], points[-1]
    bandwidth = (b2 - b1) / (t2 - t1)
    return {"latency_us": t_small * 1e6, "bandwidth_Bps": bandwidth, "gbps": bandwidth * 8 / 1e9}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--model-mb", type=float, default=25.0,
                        help="payload of the all-reduce checks")
    parser.add_argument("--netcluster", action="store_true",
                        help="run on the emulated cluster of 'netcluster up' (from h1)")
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    return launch.run_as_workers(__file__, argv, args.np, across_hosts=args.netcluster)


if __name__ == "__main__":
    sys.exit(main())
