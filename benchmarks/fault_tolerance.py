#!/usr/bin/env python
"""Kill rank 5 of 8 during decentralized training and compare with an uninterrupted run.

    python benchmarks/fault_tolerance.py --json benchmarks/results/fault_tolerance.json

Two jobs of ``sync="ripples"`` training (the generator schedule, groups of 2) on the digits
data, every step padded to ``--compute-ms`` of emulated compute (8 ranks share 2 cores
here, so real compute would measure the cores, not the synchronization):

1. 8 ranks under ``ripplesrun --fault-tolerant``; rank 5 calls ``os._exit(1)`` at step
   ``--kill-at``; the 7 survivors run on to ``--steps``;
2. 7 ranks, uninterrupted, the same number of steps.

Reported, against the bars of the fault-tolerance issue: that the 7 survivors finish, the
accuracy of their averaged model against the uninterrupted run's (bar: within 1 point),
and the stall, the step in which a survivor recovered minus its median step, the
largest over survivors (bar: <= 5 s). Rank 0 of each job prints a ``RESULT {json}`` line that this script reads.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

import torch

from harness import launch, report

KILLED_RANK = 5


def worker(args) -> None:
    import ripples.torch as hvd
    from ripples.demo import accuracy, load_data, make_model

    hvd.init()
    old_rank, old_size = hvd.rank(), hvd.size()
    data = load_data()
    model = make_model(data.x_train.shape[1], data.classes, seed=0)
    optimizer = hvd.DistributedOptimizer(
        torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
        named_parameters=model.named_parameters(), sync="ripples", schedule="generator",
        group_size=2, model=model)
    shard_x, shard_y = data.x_train[old_rank::old_size], data.y_train[old_rank::old_size]
    generator = torch.Generator().manual_seed(old_rank)
    step_s, reset_at = [], []
    hvd.on_reset(lambda: reset_at.append(len(step_s)))  # the step the recovery ran in
    hvd.barrier()
    loop_start = time.perf_counter()
    for step in range(args.steps):
        if args.kill and old_rank == KILLED_RANK and step == args.kill_at:
            sys.stdout.flush()
            os._exit(1)
        start = time.perf_counter()
        index = torch.randint(len(shard_x), (32,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(shard_x[index]), shard_y[index]).backward()
        optimizer.step()
        step_s.append(time.perf_counter() - start)
    loop_s = time.perf_counter() - loop_start
    hvd.join()
    optimizer.close()
    hvd.average_model(model)
    # The stall: the step in which this rank recovered, against its median step.
    stall = step_s[reset_at[0]] - statistics.median(step_s) if reset_at else 0.0
    stats = hvd.allgather_object((old_rank, stall, statistics.median(step_s), len(step_s),
                                  reset_at, loop_s))
    if hvd.rank() == 0:
        launch.emit_result({
            "world_before": old_size, "world_after": hvd.size(),
            "survivors": sorted(s[0] for s in stats), "steps": [s[3] for s in stats],
            "recovered_in_step": [s[4] for s in stats],
            "averaged_accuracy": accuracy(model, data.x_test, data.y_test),
            "stall_s": max(s[1] for s in stats),
            "median_step_s": statistics.median(s[2] for s in stats),
            "training_loop_s": max(s[5] for s in stats)})
    hvd.shutdown()


def run_job(args, nprocs: int, kill: bool) -> dict:
    """One ``ripplesrun`` job of ``nprocs`` ranks (rank 5 killed when ``kill``); rank 0's
    result and the job's wall time."""
    command = [sys.executable, "-m", "ripples.runner.launch", "-np", str(nprocs),
               "--compute-ms", str(args.compute_ms)]
    if kill:
        command.append("--fault-tolerant")
    command += [sys.executable, __file__, "--worker", "--steps", str(args.steps),
                "--kill-at", str(args.kill_at)] + (["--kill"] if kill else [])
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, timeout=args.timeout)
    result = launch.result_of(done, " ".join(command))
    result["wall_s"] = time.perf_counter() - start
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--kill-at", type=int, default=100)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    parser.add_argument("--timeout", type=float, default=600.0)
    parser.add_argument("--json", default="")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--kill", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return 0
    killed = run_job(args, 8, kill=True)
    baseline = run_job(args, 7, kill=False)
    gap = (baseline["averaged_accuracy"] - killed["averaged_accuracy"]) * 100
    bars = {
        "the 7 survivors finish": killed["survivors"] == [r for r in range(8)
                                                          if r != KILLED_RANK]
        and killed["steps"] == [args.steps] * 7,
        "accuracy within 1 point of an uninterrupted 7-rank run": gap <= 1.0,
        "stall <= 5 s": killed["stall_s"] <= 5.0
        and all(len(steps) == 1 for steps in killed["recovered_in_step"]),
    }
    result = {
        "setup": f"sync=ripples, generator, groups of 2, digits MLP, {args.steps} steps, "
                 f"compute EMULATED ({args.compute_ms:g} ms/step), 8 ranks on "
                 f"{os.cpu_count()} cores; rank {KILLED_RANK} killed at step {args.kill_at}",
        "killed": killed, "uninterrupted_7": baseline,
        "accuracy_gap_points": gap, "bars": {k: "PASS" if v else "MISS" for k, v in bars.items()},
    }
    print(f"{result['setup']}\n"
          f"killed run:    survivors {killed['survivors']}, recovered in steps "
          f"{killed['recovered_in_step']}, averaged accuracy "
          f"{killed['averaged_accuracy']:.4f}, stall {killed['stall_s']:.2f} s (median step "
          f"{killed['median_step_s'] * 1000:.0f} ms), training loop "
          f"{killed['training_loop_s']:.1f} s, job {killed['wall_s']:.1f} s\n"
          f"uninterrupted: averaged accuracy {baseline['averaged_accuracy']:.4f}, training "
          f"loop {baseline['training_loop_s']:.1f} s, job {baseline['wall_s']:.1f} s\n"
          f"accuracy gap: {gap:+.2f} points")
    for bar, status in result["bars"].items():
        print(f"  {status:4}  {bar}")
    if args.json:
        report.write_json(args.json, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
