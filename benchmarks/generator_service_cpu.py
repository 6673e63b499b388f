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
from pathlib import Path

from harness import launch, report, stats
from service_cpu.designs import DESIGNS, design_env
from service_cpu.job import PHASES, worker

REPO = Path(__file__).resolve().parent.parent


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
