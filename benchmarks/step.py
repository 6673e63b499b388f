"""Training-step benchmark: what gradient averaging costs per step, against its references.

    python benchmarks/step.py --np 2 --json benchmarks/results/step_np2.json
    python benchmarks/step.py --np 4 --json benchmarks/results/step_np4.json

One MPI job of ``--np`` ranks, one torch thread per rank, REAL compute: an MLP
512-1024-1024-10 (1.58 M parameters, 6.3 MB of float32 gradients), batch 32, SGD. Every
row trains the same model for ``--steps`` timed steps after ``--warmup`` steps, in the same
job, and repeats ``--repeats`` times (rows interleaved, the best of the repeats reported,
so that a burst of noise on the shared machine does not pick a winner):

- ``no communication``: the same job with no gradient averaging (the ceiling);
- ``raw MPI``: after backward, one mpi4py ``Allreduce`` of a flat gradient buffer that the
  gradients already live in (compute + the data movement alone, no overlap);
- ``ripples allreduce``: ``DistributedOptimizer`` (gradient buckets, overlap with backward);
- ``ripples allreduce, by name``: the same with ``bucket_bytes=0`` (per-name negotiation
  at ``step()``, the path CUDA and sparse gradients take);
- ``ripples allreduce, bf16``: ``Compression.bf16``;
- ``ripples static``: ``sync="ripples"`` with the static schedule (group size 2);
- ``torch DDP (gloo)``; ``Horovod`` when importable.

``--dtype bfloat16`` (or ``float16``) trains the model in 16 bits: only no communication and
ripples' bucketed and by-name rows run (MPI has no 16-bit float sum for a raw row).
``--batch`` changes the batch (a small one makes communication weigh more).

Prints steps/s (of the whole job: every rank steps in lockstep), the fraction of the
no-communication rate and the ratio to DDP. With more ranks than cores the ranks share
cores and every ratio says so (``oversubscribed``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

from harness import launch, report, stats

ROWS = ["no communication", "raw MPI", "ripples allreduce", "ripples allreduce, by name",
        "ripples allreduce, bf16", "ripples static", "torch DDP (gloo)", "Horovod"]
# A 16-bit model (--dtype): MPI has no 16-bit float sum, so no raw row; ripples' own rows.
ROWS_16BIT = ["no communication", "ripples allreduce", "ripples allreduce, by name"]
BATCH = 32


def make_model(seed: int = 0, dtype: str = "float32"):
    import torch
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(512, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                               torch.nn.Linear(1024, 10)).to(getattr(torch, dtype))


def timed(run_step, steps: int, warmup: int, barrier) -> float:
    """Steps per second of ``run_step`` on this rank, between two barriers."""
    for _ in range(warmup):
        run_step()
    barrier()
    start = time.perf_counter()
    for _ in range(steps):
        run_step()
    barrier()
    return steps / (time.perf_counter() - start)


def worker(args) -> None:
    import torch
    from mpi4py import MPI

    import ripples.torch as hvd

    torch.set_num_threads(1)
    hvd.init()
    world = MPI.COMM_WORLD
    rank, size = world.Get_rank(), world.Get_size()
    generator = torch.Generator().manual_seed(rank)
    x = torch.randn(args.batch, 512, generator=generator).to(getattr(torch, args.dtype))
    y = torch.randint(0, 10, (args.batch,), generator=generator)
    loss_fn = torch.nn.CrossEntropyLoss()

    def plain(model, optimizer, after_backward=None):
        def run_step():
            optimizer.zero_grad()
            loss_fn(model(x), y).backward()
            if after_backward is not None:
                after_backward()
            optimizer.step()
        return run_step

    def no_communication():
        model = make_model(dtype=args.dtype)
        return plain(model, torch.optim.SGD(model.parameters(), lr=0.01)), None

    def raw_mpi():
        model = make_model(dtype=args.dtype)
        params = list(model.parameters())
        flat = torch.zeros(sum(p.numel() for p in params))
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        optimizer = torch.optim.SGD(params, lr=0.01)

        def reduce():
            world.Allreduce(MPI.IN_PLACE, flat.numpy(), op=MPI.SUM)
            flat.mul_(1.0 / size)

        def run_step():
            flat.zero_()  # the gradients stay views of the buffer
            loss_fn(model(x), y).backward()
            reduce()
            optimizer.step()
        return run_step, None

    def ripples_row(bucket_bytes=None, **kwargs):
        def build():
            import dataclasses

            from ripples.runtime import current
            runtime = current()
            saved = runtime.config
            if bucket_bytes is not None:  # the setting is read when the optimizer is made
                runtime.config = dataclasses.replace(saved, bucket_bytes=bucket_bytes)
            try:
                model = make_model(dtype=args.dtype)
                optimizer = hvd.DistributedOptimizer(
                    torch.optim.SGD(model.parameters(), lr=0.01),
                    named_parameters=model.named_parameters(), **kwargs)
            finally:
                runtime.config = saved
            return plain(model, optimizer), getattr(optimizer, "close", None)
        return build

    def ddp():
        import torch.distributed as dist
        if not dist.is_initialized():
            port = world.bcast(launch.free_port() if rank == 0 else None, root=0)
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                    world_size=size)
        model = torch.nn.parallel.DistributedDataParallel(make_model(dtype=args.dtype))
        return plain(model, torch.optim.SGD(model.parameters(), lr=0.01)), None

    def horovod():
        try:
            import horovod.torch as real_hvd
        except ImportError:
            return None, None
        real_hvd.init()
        model = make_model(dtype=args.dtype)
        optimizer = real_hvd.DistributedOptimizer(torch.optim.SGD(model.parameters(), lr=0.01),
                                                  named_parameters=model.named_parameters())
        return plain(model, optimizer), None

    builders = {
        "no communication": no_communication,
        "raw MPI": raw_mpi,
        "ripples allreduce": ripples_row(),
        "ripples allreduce, by name": ripples_row(bucket_bytes=0),
        "ripples allreduce, bf16": ripples_row(compression=hvd.Compression.bf16),
        "ripples static": ripples_row(sync="ripples", schedule="static", group_size=2),
        "torch DDP (gloo)": ddp,
        "Horovod": horovod,
    }
    best = {}
    for _ in range(args.repeats):
        for row in args.rows:
            run_step, close = builders[row]()
            if run_step is None:
                best.setdefault(row, None)
                continue
            rate = timed(run_step, args.steps, args.warmup, world.Barrier)
            if close is not None:
                close()
            rate = world.allreduce(rate, op=MPI.MIN)  # lockstep: the slowest rank's rate
            best[row] = max(rate, best.get(row) or 0.0)
    if rank == 0:
        Path(args.out).write_text(json.dumps(best))


def table(best: dict, np_: int, cores: int) -> str:
    base = best.get("no communication")
    ddp = best.get("torch DDP (gloo)")
    note = " (oversubscribed: ranks share cores)" if np_ > cores else ""
    lines = [f"{'job':<28} {'steps/s':>8} {'of no-comm':>10} {'x DDP':>6}{note}"]
    for row, rate in best.items():
        if rate is None:
            lines.append(f"{row:<28} {'not importable':>8}")
            continue
        lines.append(f"{row:<28} {rate:>8.1f} {stats.ratio(rate, base):>10.2f} "
                     f"{stats.ratio(rate, ddp):>6.2f}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--np", type=int, default=2)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rows", help="rows to run, separated by ; (default: all that fit "
                        "--dtype)")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                        help="the model's dtype (16-bit: ripples' rows and no communication)")
    parser.add_argument("--batch", type=int, default=BATCH)
    parser.add_argument("--json", help="write the results here")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    valid = ROWS if args.dtype == "float32" else ROWS_16BIT
    args.rows = ([r.strip() for r in args.rows.split(";") if r.strip()] if args.rows
                 else list(valid))
    unknown = [r for r in args.rows if r not in valid]
    if unknown:
        parser.error(f"--rows: unknown with --dtype {args.dtype}: {unknown}; valid: {valid}")
    if args.worker:
        worker(args)
        return 0
    out = f"/tmp/ripples_step_{os.getpid()}.json"
    launch.run_job(args.np, launch.script_command(
        __file__, "--worker", "--out", out, "--steps", args.steps, "--warmup", args.warmup,
        "--repeats", args.repeats, "--rows", ";".join(args.rows), "--dtype", args.dtype,
        "--batch", args.batch), timeout=1800)
    best = json.loads(Path(out).read_text())
    cores = os.cpu_count() or 1
    print(f"training-step benchmark: {args.np} ranks on {cores} cores, real compute, MLP "
          f"512-1024-1024-10 in {args.dtype}, batch {args.batch}, one torch thread per rank, best of "
          f"{args.repeats} x {args.steps} steps, {time.strftime('%Y-%m-%d')}")
    print(table(best, args.np, cores))
    if args.json:
        report.write_json(args.json, {"np": args.np, "oversubscribed": args.np > cores,
                                      "compute": "real", "steps_per_s": best,
                                      "args": vars(args)})
    return 0


if __name__ == "__main__":
    sys.exit(main())
