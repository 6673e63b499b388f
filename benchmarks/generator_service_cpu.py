"""CPU the Group Generator service thread takes from rank 0, idle and under requests.

    python benchmarks/generator_service_cpu.py --repeat 3 \
        --json benchmarks/results/generator_service_cpu.json

Launches one ``mpiexec -n 4`` job per design (``--repeat`` jobs, the median kept). Rank 0
runs the service thread of the design; rank 0 (both its threads) is pinned to the first
core and the other ranks to the other cores. Four phases of ``--phase-s`` seconds, each
measured after its first ``--settle-s`` (steady state: idle means silent for over a second):

* ``idle``: no rank sends anything, rank 0's main thread sleeps (the service has a core);
* ``load``: every rank, rank 0 included, asks for groups every ``--interval-ms``
  (staggered: 40 requests/s at 4 ranks and 100 ms) and waits for the answer (a 20 us nap
  loop, the same for every design); the generator runs ``policy="all"``, so every request
  is answered at once and the latency measured is the service's own (detection, GIL,
  reply), not the generator's waiting;
* ``idle+compute`` and ``load+compute``: the same while rank 0's main thread computes
  (single-threaded numpy matmuls) on the service thread's core, as a training step does.

Reported per design and phase: the service thread's CPU time (``pthread_getcpuclockid``) as
a percentage of the phase's wall time (in the ``+compute`` phases, what it took from the
compute thread's core), the answer latency seen by the clients (median, p99), and in the
JSON rank 0's compute iterations per second (``rank0_compute_lost_pct``: relative to the
design ``none``, which runs no service; only meaningful on an otherwise quiet machine).

Designs:

* ``nap``: the loop the service had before: ``improbe``, then a ``time.sleep`` nap starting
  at 100 us and doubling to 500 us (it also called ``generator.poll()`` on every wake-up,
  left out here).
* ``recv``: a blocking receive of each request (``comm.recv`` from any source, i.e.
  ``MPI_Mprobe`` + ``MPI_Mrecv``), Open MPI's defaults (``mpi_yield_when_idle=0``).
  ``Request.Wait`` on an ``Irecv`` waits in the same progress loop.
* ``recv-yield``: the same with ``OMPI_MCA_mpi_yield_when_idle=1`` (``sched_yield`` in the
  progress loop when nothing progressed).
* ``recv-nanosleep``: the same with the yield done by ``nanosleep`` of ``--nanosleep-us``
  (``OMPI_MCA_threads_pthreads_yield_strategy=nanosleep``): a poll loop in C, but the
  setting applies to every MPI wait of the process (rank 0's collectives included).
* ``current``: ``ripples.schedule.service.GeneratorService`` as it is in this tree, with
  the doorbell ``GeneratorSchedule`` sets up (every client rings a UDP socket after each
  request; the service sleeps in ``select()`` between requests).
* ``current-nobell``: the same service without a doorbell (its fallback when some rank
  cannot make one): the nap loop of 100 us doubling to 500 us, 10 ms after a second idle.

Jobs are launched with ``--host localhost:N`` rather than ``--oversubscribe``: Open MPI
turns ``mpi_yield_when_idle`` on for an oversubscribed job whatever the environment says.
Every design sets it explicitly.
"""
from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

from harness import launch, report, stats

REPO = Path(__file__).resolve().parent.parent
DESIGNS = ("none", "nap", "recv", "recv-yield", "recv-nanosleep", "current",
           "current-nobell")
TAG_REQUEST, TAG_REPLY = 0x5251, 0x5252


# ----------------------------------------------------------------------------- worker side
def _services():
    """Service classes of the designs (imported inside the MPI job only)."""
    from mpi4py import MPI

    from ripples.schedule.service import GeneratorService

    class _Handling(GeneratorService):
        def _handle(self, op, rank, request_id):
            if op == "groups":
                self.generator.request(rank)
                self._request_ids[rank] = request_id
            else:  # "close"
                self.closed.add(rank)
                self._request_ids.pop(rank, None)
                self._send(rank, ("ok", self.generator.leave(rank), request_id))
            for worker, pairs in self.generator.poll().items():
                self._send(worker, ("ok", pairs, self._request_ids.pop(worker)))
            self._sends = [req for req in self._sends if not req.Test()]

        def _send(self, rank, message):
            self._sends.append(self.comm.isend(message, dest=rank, tag=TAG_REPLY))

    class NapService(_Handling):
        """The former loop: improbe, then naps of 100 us doubling to 500 us."""

        def _run(self):
            nap = 1e-4
            try:
                while len(self.closed) < self.comm.Get_size():
                    msg = self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST)
                    if msg is not None:
                        self._handle(*msg.recv())
                        nap = 1e-4
                        continue
                    self._sends = [req for req in self._sends if not req.Test()]
                    time.sleep(nap)
                    nap = min(5e-4, nap * 2)
                MPI.Request.Waitall(self._sends)
            except BaseException as exc:
                self.error = exc

    class RecvService(_Handling):
        """A blocking receive of every request (no deadlines needed with policy "all")."""

        def _run(self):
            try:
                while len(self.closed) < self.comm.Get_size():
                    self._handle(*self.comm.recv(source=MPI.ANY_SOURCE, tag=TAG_REQUEST))
                MPI.Request.Waitall(self._sends)
            except BaseException as exc:
                self.error = exc

    return {"nap": NapService, "recv": RecvService, "recv-yield": RecvService,
            "recv-nanosleep": RecvService, "current": GeneratorService,
            "current-nobell": GeneratorService}


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
            service = _services()[args.design](comm, generator)
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


# ----------------------------------------------------------------------------- driver side
def design_env(design: str, nanosleep_us: float) -> dict:
    env = {"OMPI_MCA_mpi_yield_when_idle": "1" if design in ("recv-yield", "recv-nanosleep")
           else "0"}
    if design == "recv-nanosleep":
        env["OMPI_MCA_threads_pthreads_yield_strategy"] = "nanosleep"
        env["OMPI_MCA_threads_pthreads_nanosleep_time"] = str(int(nanosleep_us * 1e3))
    return env


def run_design(design: str, args) -> dict:
    """One job of ``args.ranks`` ranks running ``design``; rank 0's result."""
    command = launch.script_command(__file__, "--worker", "--design", design, "--phase-s",
                                    args.phase_s, "--settle-s", args.settle_s,
                                    "--interval-ms", args.interval_ms)
    extra = design_env(design, args.nanosleep_us)
    env = {**extra, "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    # Declared slots, not --oversubscribe: an oversubscribed job would have Open MPI force
    # mpi_yield_when_idle on, whatever the environment says.
    done = launch.run_job(args.ranks, command, env=env, capture=True, check=False,
                          declare_slots=True, timeout=len(PHASES) * args.phase_s + 120)
    row = launch.result_of(done, f"design {design}")
    row["env"] = extra
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--designs", default=",".join(DESIGNS))
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--phase-s", type=float, default=5.0)
    parser.add_argument("--settle-s", type=float, default=1.5,
                        help="the first seconds of every phase are not measured")
    parser.add_argument("--interval-ms", type=float, default=100.0)
    parser.add_argument("--nanosleep-us", type=float, default=100.0)
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs per design; the run of median load+compute CPU is kept")
    parser.add_argument("--json", help="write the rows here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--design", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        try:
            worker(args)
        except BaseException:
            import traceback

            from mpi4py import MPI
            traceback.print_exc()
            MPI.COMM_WORLD.Abort(1)  # do not leave the other ranks waiting
        return 0
    rows = []
    for design in args.designs.split(","):
        runs = [run_design(design, args) for _ in range(args.repeat)]
        rows.append(stats.median_run(runs, key=lambda r: r["load+compute"]["service_cpu_pct"]))
    base = next((r for r in rows if r["design"] == "none"), None)
    print(f"{'':>15} | {'service thread CPU, % of a core':^43} | {'answer latency, us':^41}")
    print(f"{'design':>15} | {'idle':>9} {'load':>9} {'idle+comp':>11} {'load+comp':>11} | "
          f"{'load med':>9} {'load p99':>9} {'l+c med':>9} {'l+c p99':>10}")
    fmt = lambda v: "-" if v is None else f"{v:.0f}"  # noqa: E731
    for row in rows:
        if base is not None:
            for phase in ("idle+compute", "load+compute"):
                row[phase]["rank0_compute_lost_pct"] = round(100 * (
                    1 - row[phase]["rank0_compute_per_s"] / base[phase]["rank0_compute_per_s"]), 2)
        print(f"{row['design']:>15} | " + " ".join(
            f"{row[p]['service_cpu_pct']:{w}.2f}" for p, w in zip(PHASES, (9, 9, 11, 11)))
            + f" | {fmt(row['load']['latency_us_median']):>9} "
              f"{fmt(row['load']['latency_us_p99']):>9} "
              f"{fmt(row['load+compute']['latency_us_median']):>9} "
              f"{fmt(row['load+compute']['latency_us_p99']):>10}")
    if args.json:
        command = report.command_line(None if argv is None else [sys.argv[0], *argv])
        report.write_json(args.json, {
            "python": platform.python_version(), "ranks": args.ranks,
            "interval_ms": args.interval_ms, "phase_s": args.phase_s, "settle_s": args.settle_s,
            "nanosleep_us": args.nanosleep_us,
            "phases": {"idle": "no requests, rank 0's main thread asleep (a free core)",
                       "load": "every rank asks every interval_ms, rank 0's main "
                               "thread asleep between its own requests",
                       "idle+compute": "no requests, rank 0's main thread computes on "
                                       "the service thread's core",
                       "load+compute": "both"},
            "rows": rows}, command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
