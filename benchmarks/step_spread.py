"""The compute part of a training step on this machine, without any communication: its
median, its spread and the update after it, the step time, jitter and update time the
simulator takes.

    netcluster up 4 --slots 2 --bw 1gbit
    python benchmarks/step_spread.py --np 8 --netcluster --model-mb 20 \\
        --json benchmarks/results/step_spread_hosts4x2_20mb.json

Every rank runs ``benchmarks/train.py``'s step with nothing between the ranks: a batch of
the digits MLP (padded by ``--model-mb`` of parameters, as ``train.py --model-mb``), the
forward and backward pass padded to ``--compute-ms`` by ripples' own slowdown injector (as
``hvd.init(compute_ms=...)`` does), then the SGD update of the whole model (momentum 0.9),
which in training runs after the communication and is neither padded nor slowed down. All
ranks run at once, so they share this machine's cores as the ranks of a training run do.
Reported, over all ranks' steps: the median of the padded part and the spread of its
logarithm (half the range between the 16th and the 84th percentile, the standard deviation
of a lognormal spread, robust to the rare step that waits long for a core), and the median
of the update. The simulator draws every step's time as ``median * exp(spread * N(0, 1)) +
update`` (``ripples sim --step-ms --step-jitter --update-ms``).
"""
from __future__ import annotations

import argparse
import math
import sys
import time

from harness import launch, report, stats


def lognormal_spread(times) -> float:
    """Half the 16th-84th percentile range of ``log(times)``: a lognormal's sigma."""
    logs = sorted(math.log(t) for t in times)
    return (stats.percentile(logs, 0.84) - stats.percentile(logs, 0.16)) / 2


def worker(args) -> None:
    import torch
    from mpi4py import MPI
    from ripples.core.heterogeneity import SlowdownInjector
    from ripples.demo import load_data
    import ripples.demo as demo

    if args.model_mb:
        from padded import pad_models
        pad_models(args.model_mb)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    torch.set_num_threads(1)
    data = load_data()
    model = demo.make_model(data.x_train.shape[1], data.classes, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    injector = SlowdownInjector(rank, compute_ms=args.compute_ms)
    generator = torch.Generator().manual_seed(rank)
    padded, updates = [], []
    comm.Barrier()
    for step in range(args.warmup + args.steps):
        start = time.perf_counter()
        index = torch.randint(len(data.x_train), (args.batch,), generator=generator)
        optimizer.zero_grad()
        torch.nn.functional.cross_entropy(model(data.x_train[index]),
                                          data.y_train[index]).backward()
        injector.finish_step(time.perf_counter() - start)
        computed = time.perf_counter()
        optimizer.step()
        if step >= args.warmup:
            padded.append(computed - start)
            updates.append(time.perf_counter() - computed)
    every = comm.gather((padded, updates), root=0)
    if rank == 0:
        all_padded = [t for rank_padded, _ in every for t in rank_padded]
        all_updates = [t for _, rank_updates in every for t in rank_updates]
        result = {"ranks": comm.Get_size(), "model_mb": args.model_mb,
                  "compute_ms": args.compute_ms, "batch": args.batch, "steps": args.steps,
                  "step_ms": stats.median(all_padded) * 1e3,
                  "step_jitter": lognormal_spread(all_padded),
                  "update_ms": stats.median(all_updates) * 1e3,
                  "per_rank_step_ms": [stats.median(p) * 1e3 for p, _ in every],
                  "per_rank_update_ms": [stats.median(u) * 1e3 for _, u in every],
                  "p99_ms": stats.percentile(all_padded, 0.99) * 1e3,
                  "cluster": launch.cluster_status() if args.netcluster else None}
        print(f"{result['ranks']} ranks at once: {args.compute_ms:g} ms emulated compute took "
              f"{result['step_ms']:.1f} ms median (p99 {result['p99_ms']:.1f}), lognormal "
              f"spread {result['step_jitter']:.3f}; the update of {args.model_mb:g} MB more "
              f"{result['update_ms']:.1f} ms")
        if args.json:
            report.write_json(args.json, result)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--model-mb", type=float, default=0.0,
                        help="parameters added to the MLP, as train.py --model-mb")
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
