"""CPU cost of the Group Generator's logic at scale, in one process, in emulated time.

    python benchmarks/generator_scale.py --workers 1024,4096 --seconds 10 \
        --json benchmarks/results/generator_scale.json

Drives the real :class:`ripples.schedule.GroupGenerator` (the object the MPI service runs on
rank 0) with ``--workers`` simulated workers. Every worker sends a request, receives its
group, and asks again ``--interval-ms`` later (times drawn around that interval, so the
requests spread out as real steps do); ``--slow`` workers ask ``--slow-factor`` times less
often. Time is injected: the generator's clock is the emulated clock, and wake-ups happen at
``next_deadline()`` exactly as the service does them. Only the process CPU time spent inside
the generator's calls (``request``, ``poll``, ``next_deadline``) is counted; the CPU share of
one core is that time divided by the emulated seconds. Messaging (pickling, MPI) is not
included: it is the same per request whatever the generator does.
"""
from __future__ import annotations

import argparse
import heapq
import platform
import sys
import time

import numpy as np

from harness import report
from ripples.schedule import GroupGenerator


class _Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def measure(workers: int, seconds: float, interval_s: float, policy: str, group_size: int,
            slow: int, slow_factor: float, seed: int = 0) -> dict:
    """Run ``workers`` requesters for ``seconds`` of emulated time; return the counts and
    the CPU seconds spent inside the generator."""
    clock = _Clock()
    gen = GroupGenerator(workers, group_size, seed=seed, policy=policy, clock=clock)
    rng = np.random.default_rng(seed)
    period = np.full(workers, interval_s)
    period[:slow] *= slow_factor
    events = [(float(t), w) for w, t in enumerate(rng.uniform(0, interval_s, workers))]
    heapq.heapify(events)
    wake = None  # pending deadline wake-up; worker id -1 in the heap
    cpu = 0.0
    requests = answers = 0
    while events:
        at, worker = heapq.heappop(events)
        if at > seconds:
            break
        clock.now = at
        began = time.process_time()
        if worker >= 0:
            gen.request(worker)
            requests += 1
        else:
            wake = None
        answered = gen.poll()
        deadline = gen.next_deadline()
        cpu += time.process_time() - began
        for w in answered:
            answers += 1
            heapq.heappush(events, (at + period[w] * rng.uniform(0.9, 1.1), w))
        if deadline is not None and deadline != wake:
            wake = deadline
            heapq.heappush(events, (max(deadline, at), -1))
    return {"workers": workers, "policy": policy, "group_size": group_size,
            "interval_ms": interval_s * 1e3, "slow": slow, "slow_factor": slow_factor,
            "emulated_s": seconds, "requests": requests, "answers": answers,
            "divisions": gen.divisions, "requests_per_s": requests / seconds,
            "cpu_s": cpu, "cpu_us_per_request": cpu / max(requests, 1) * 1e6,
            "core_share": cpu / seconds}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", default="1024,4096", help="comma-separated worker counts")
    parser.add_argument("--seconds", type=float, default=10.0, help="emulated seconds per run")
    parser.add_argument("--interval-ms", type=float, default=100.0,
                        help="time between a worker's answer and its next request")
    parser.add_argument("--policies", default="ready,all", help="division policies to run")
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--slow", type=int, default=1, help="workers that ask less often")
    parser.add_argument("--slow-factor", type=float, default=5.0)
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args(argv)
    rows = []
    print(f"{'workers':>7} {'policy':>6} {'req/s':>8} {'us/req':>7} {'core':>6} {'divisions':>9}")
    for workers in [int(w) for w in args.workers.split(",")]:
        for policy in args.policies.split(","):
            row = measure(workers, args.seconds, args.interval_ms / 1e3, policy,
                          args.group_size, args.slow, args.slow_factor)
            rows.append(row)
            print(f"{workers:>7} {policy:>6} {row['requests_per_s']:>8.0f} "
                  f"{row['cpu_us_per_request']:>7.1f} {row['core_share']:>6.1%} "
                  f"{row['divisions']:>9}", flush=True)
    if args.json:
        typed = None if argv is None else ["benchmarks/generator_scale.py", *argv]
        command = report.command_line(typed)
        report.write_json(args.json, {"python": platform.python_version(), "rows": rows},
                          command)
    return 0


if __name__ == "__main__":
    sys.exit(main())
