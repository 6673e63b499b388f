"""How far apart the members of one P-Reduce leave it: the exit spread the simulator takes,
measured apart from any training run.

    netcluster up 4 --slots 2 --bw 1gbit
    python benchmarks/exit_spread.py --np 8 --netcluster --model-mb 20 \\
        --json benchmarks/results/exit_spread_hosts4x2_20mb.json

Every iteration divides all ranks at random (one seed on every rank) into groups of
``k`` (a trailing member joins the last group, as the Group Generator's division), for k
= 2, 3, 4, and every group runs ripples' P-Reduce (``hvd.partial_allreduce``) of
``--model-mb`` float32 at once, as the groups of one division do in training. The ranks
start together (a barrier) and each notes when its P-Reduce returned; this machine's
monotonic clock is one for every emulated host, so the times compare across hosts. Per
group the *exit spread* is the time between its first and its last member's return, and
each member's *early exit* the share of the group's duration (start to the last return)
by which it returned before the last: the simulator lets member ``i`` of a collective of
duration ``d`` leave at ``d * (1 - e_i)``, ``e_i`` drawn from these (``ripples sim
--exit-early``). Pure communication: no compute, no update.
"""
from __future__ import annotations

import argparse
import sys
import time

from harness import launch, report, stats

GROUP_SIZES = (2, 3, 4)


def divide_at_random(size: int, k: int, rng) -> list:
    """``range(size)`` shuffled and cut into groups of ``k``; a trailing member alone joins
    the group before it."""
    order = [int(w) for w in rng.permutation(size)]
    groups = [order[i:i + k] for i in range(0, size, k)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return groups


def group_exits(groups: list, start: float, ends: list) -> list:
    """Per group: (members, exit spread in s, duration in s, each member's early exit as a
    share of the duration) from every rank's return time ``ends``."""
    out = []
    for group in groups:
        last = max(ends[w] for w in group)
        duration = last - start
        out.append((len(group), last - min(ends[w] for w in group), duration,
                    [(last - ends[w]) / duration for w in group]))
    return out


def worker(args) -> None:
    import numpy as np
    import torch
    import ripples.torch as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    torch.set_num_threads(1)
    data = torch.ones(int(args.model_mb * 1e6) // 4)
    rng = np.random.default_rng(args.seed)
    rows = {k: [] for k in GROUP_SIZES if k < size}
    for k in rows:
        for iteration in range(args.warmup + args.iterations):
            groups = divide_at_random(size, k, rng)
            mine = next(g for g in groups if rank in g)
            hvd.barrier()
            start = time.perf_counter()
            hvd.partial_allreduce(data, mine)
            ends = hvd.allgather_object(time.perf_counter())
            starts = hvd.allgather_object(start)
            if iteration >= args.warmup:
                rows[k].extend(group_exits(groups, max(starts), ends))
    if rank == 0:
        result = {"ranks": size, "model_mb": args.model_mb, "iterations": args.iterations,
                  "compute": "none (pure communication)", "by_group_size": {},
                  "cluster": launch.cluster_status() if args.netcluster else None}
        for k, groups in rows.items():
            early = [e for *_, shares in groups for e in shares if e > 0]
            summary = {"groups": len(groups),
                       "members": stats.median([m for m, *_ in groups]),
                       "exit_spread_ms": stats.median([s for _, s, *_ in groups]) * 1e3,
                       "exit_spread_p90_ms": stats.percentile([s for _, s, *_ in groups],
                                                              0.9) * 1e3,
                       "duration_ms": stats.median([d for _, _, d, _ in groups]) * 1e3,
                       "early_exit_median": stats.median(early) if early else 0.0,
                       "early_exit_p90": stats.percentile(early, 0.9) if early else 0.0,
                       "early_exits": [round(e, 4) for e in early]}
            result["by_group_size"][str(k)] = summary
            print(f"groups of {k}: {args.model_mb:g} MB P-Reduce took "
                  f"{summary['duration_ms']:.0f} ms (median, to the last member), its members "
                  f"left {summary['exit_spread_ms']:.0f} ms apart (p90 "
                  f"{summary['exit_spread_p90_ms']:.0f}); the earlier ones "
                  f"{summary['early_exit_median']:.1%} of it before the last (median)")
        if args.json:
            report.write_json(args.json, result)
    hvd.shutdown()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--model-mb", type=float, default=20.0)
    parser.add_argument("--seed", type=int, default=0)
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
