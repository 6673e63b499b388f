"""The throughput ceiling of ``train.py --model-mb`` on this machine: every rank trains the
padded MLP alone (no communication at all), each step padded to ``--compute-ms`` as in
``train.py``, all ranks at once on the shared cores.

    python benchmarks/padded_step.py --np 8 --model-mb 20 --json out.json

With the plain MLP the steps take the emulated time; with a large parameter the optimizer's
passes over it (SGD with momentum) are real CPU work that 8 ranks on 2 cores share, which
no emulated compute time contains. Reported: steps/s summed over ranks against the ceiling
``np / compute``.
"""
from __future__ import annotations

import argparse
import sys
import time

from harness import launch, report


def worker(args) -> None:
    import torch
    from mpi4py import MPI

    import ripples.demo as demo
    from padded import pad_models

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    torch.set_num_threads(1)
    if args.model_mb:
        pad_models(args.model_mb)
    data = demo.load_data()
    model = demo.make_model(data.x_train.shape[1], data.classes, 0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    generator = torch.Generator().manual_seed(rank)
    step_s, steps, busy = args.compute_ms / 1e3, 0, 0.0
    comm.Barrier()
    start = time.perf_counter()
    while time.perf_counter() - start < args.seconds:
        began = time.perf_counter()
        index = torch.randint(len(data.x_train), (32,), generator=generator)
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(data.x_train[index]), data.y_train[index])
        loss.backward()
        optimizer.step()
        spent = time.perf_counter() - began
        busy += spent
        time.sleep(max(0.0, step_s - spent))
        steps += 1
    wall = time.perf_counter() - start
    counts = comm.gather((steps, busy), root=0)
    if rank == 0:
        total = sum(c[0] for c in counts)
        ceiling = len(counts) / step_s
        row = {"ranks": len(counts), "model_mb": args.model_mb, "steps_per_s": total / wall,
               "ceiling_steps_per_s": ceiling,
               "work_ms_per_step": 1e3 * sum(c[1] for c in counts) / total}
        print(f"{len(counts)} ranks, MLP + {args.model_mb:g} MB, no communication: "
              f"{row['steps_per_s']:.1f} steps/s of a {ceiling:.0f} ceiling; real work "
              f"{row['work_ms_per_step']:.1f} ms per step")
        if args.json:
            report.write_json(args.json, {"compute": f"emulated, padded to {args.compute_ms:g}"
                                          " ms; the optimizer's work real", "rows": [row]})


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=8)
    parser.add_argument("--model-mb", type=float, default=20.0)
    parser.add_argument("--compute-ms", type=float, default=50.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--json", help="write the result here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        worker(args)
        return 0
    return launch.run_as_workers(__file__, argv, args.np, timeout=120 + args.seconds)


if __name__ == "__main__":
    sys.exit(main())
