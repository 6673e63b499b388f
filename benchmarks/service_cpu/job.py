"""What every rank of a ``benchmarks/generator_service_cpu.py`` job runs: four phases of
requests and compute, with rank 0's service thread measured (CPU time, answer latency)."""
from __future__ import annotations

import os
import time

from harness import launch, stats

from .designs import TAG_REPLY, TAG_REQUEST, service_classes


def _ask(comm, rank, request_id, op="groups", doorbell=None):
    """One request, answered within the returned latency (a 20 us nap loop)."""
    began = time.perf_counter()
    send = comm.isend((op, rank, request_id), dest=0, tag=TAG_REQUEST)
    if doorbell is not None:
        doorbell.ring()
    while True:
        msg = comm.improbe(source=0, tag=TAG_REPLY)
        if msg is not None:
            reply = msg.recv()
            break
        if time.perf_counter() - began > 10:
            raise RuntimeError(f"rank {rank}: no answer to {op!r} {request_id} in 10 s")
        time.sleep(2e-5)
    send.wait()
    assert reply[0] == "ok" and reply[2] == request_id, reply
    return time.perf_counter() - began


PHASES = ("idle", "load", "idle+compute", "load+compute")


def worker(args) -> None:
    import numpy as np
    from mpi4py import MPI

    from ripples.schedule import GroupGenerator
    from ripples.comm.doorbell import Doorbell
    from ripples.schedule.service import GeneratorService

    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:  # rank 0 (both its threads) alone on one core, the others elsewhere
        os.sched_setaffinity(0, {cores[0]} if rank == 0 else set(cores[1:]))
    comm = world.Dup()
    doorbell = Doorbell.setup(comm) if args.design == "current" else None
    service = None
    if rank == 0 and args.design != "none":
        generator = GroupGenerator(size, 2, seed=0, policy="all")
        if args.design == "current":
            service = GeneratorService(comm, generator, doorbell=doorbell)
        else:
            service = service_classes()[args.design](comm, generator)
        service.start()
    clock = None if service is None else time.pthread_getcpuclockid(service._thread.ident)

    def thread_cpu():
        return 0.0 if clock is None else time.clock_gettime(clock)

    a = np.random.default_rng(rank).standard_normal((96, 96))
    interval = args.interval_ms / 1e3
    request_id = 0
    rows = {}
    start = world.bcast(time.time() + 0.5 if rank == 0 else None)
    for index, phase in enumerate(PHASES):
        begin = start + index * args.phase_s
        end = begin + args.phase_s
        asks = "load" in phase and args.design != "none"
        computes = "compute" in phase and rank == 0
        next_ask = begin + interval * (rank + 0.5) / size  # staggered
        latencies = []
        iterations = 0
        settled = begin + args.settle_s  # measured from here: the phase's steady state
        while time.time() < begin:
            time.sleep(1e-3)
        cpu0 = None
        while True:
            now = time.time()
            if now >= end:
                break
            if cpu0 is None and now >= settled:
                cpu0 = thread_cpu()
            if computes:
                for _ in range(20):  # ~1 ms of compute between clock checks
                    a = a @ a
                    a /= np.abs(a).max()
                iterations += now >= settled
            else:
                time.sleep(max(0.0, min(end, settled if cpu0 is None else end,
                                        next_ask if asks else end) - now))
            if asks and time.time() >= next_ask:
                request_id += 1
                latency = _ask(comm, rank, request_id, doorbell=doorbell)
                if now >= settled:
                    latencies.append(latency)
                next_ask += interval
        measured = args.phase_s - args.settle_s
        rows[phase] = {"cpu_pct": 100 * (thread_cpu() - cpu0) / measured,
                       "compute_per_s": iterations / measured, "latencies": latencies}
    if args.design != "none":
        _ask(comm, rank, request_id + 1, "close", doorbell)
    if service is not None:
        service.join(30.0)
        assert service.error is None, service.error
    if doorbell is not None:
        doorbell.close()
    comm.Free()
    gathered = world.gather({p: r["latencies"] for p, r in rows.items()})
    if rank != 0:
        return
    result = {"design": args.design}
    for phase, row in rows.items():
        lat = sorted(x * 1e6 for view in gathered for x in view[phase])
        result[phase] = {
            "service_cpu_pct": round(row["cpu_pct"], 3),
            "rank0_compute_per_s": row["compute_per_s"],
            "requests": len(lat),
            "latency_us_median": round(stats.median(lat), 1) if lat else None,
            "latency_us_p99": round(stats.percentile(lat, 0.99), 1) if lat else None,
        }
    launch.emit_result(result)

