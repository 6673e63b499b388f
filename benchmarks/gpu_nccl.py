"""Latency of ripples' NCCL path against a direct NCCL call, and an NCCL communicator's
creation cost, on one GPU.

With one GPU, NCCL runs a world of one rank (NCCL refuses two ranks of a communicator on
one GPU), so this measures what ripples adds around the call, not the network:

- ``nccl direct``: cupy's ``ncclAllReduce`` on the current stream, then a stream sync;
- ``ripples NcclCommunicator``: the same call through ``ripples.comm.nccl`` (argument
  checks and the watchdog's two CUDA events), then a stream sync; ``unwatched``: the
  same without a watchdog;
- ``direct + 2 events``: the direct call between two CUDA event records, the watchdog's
  events without its bookkeeping (splits the watchdog's cost into the two);
- ``ripples allreduce_``: ``hvd.allreduce_`` of a CUDA tensor in a one-rank job (the whole
  Python path; a group of one makes no NCCL call, it scales in place), then a sync.

Creation, each a median of ``--inits``: ``ncclCommInitRank`` (through cupy) for a one-rank
communicator, and ``ncclCommSplit`` of a one-rank parent, without and with resource
sharing (``split_share``), where cupy exposes it. Times are medians of ``--iters`` calls,
the four rows interleaved so that they see the same machine.

    ripplesrun -np 1 python benchmarks/gpu_nccl.py [--iters 200] [--inits 5] [--json PATH]
"""
from __future__ import annotations

import argparse
import time

import torch

from harness import report, stats, timing

SIZES = [256, 4096, 65536, 1 << 20]


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=200)
    parser.add_argument("--inits", type=int, default=5)
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        parser.error("needs a CUDA GPU")
    from cupy.cuda import nccl

    import ripples.torch as hvd
    from ripples.comm.nccl import NcclCommunicator, nccl_version
    from ripples.comm.nccl_watchdog import NcclWatchdog
    from ripples.kernels.streams import CudaEvent

    hvd.init()
    device = torch.device("cuda", 0)
    torch.cuda.set_device(device)
    stream = torch.cuda.current_stream(device)
    dog = NcclWatchdog(60.0)
    ours = NcclCommunicator(1, nccl.get_unique_id(), 0, device, watchdog=dog, label="bench")
    unwatched = NcclCommunicator(1, nccl.get_unique_id(), 0, device, label="bench")
    direct = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    print(f"device: {torch.cuda.get_device_name(device)}, NCCL {nccl_version()}, torch "
          f"{torch.__version__}, compute: none (latency of one call, synchronized)")
    print(f"{'bytes':>8} {'nccl direct(us)':>16} {'NcclCommunicator(us)':>21} "
          f"{'unwatched(us)':>14} {'+2 events(us)':>14} {'allreduce_(us)':>15} {'added(us)':>10}")
    rows = []
    for nbytes in SIZES:
        x = torch.ones(nbytes // 4, device=device)

        def sync(_=None):
            stream.synchronize()

        began, done = CudaEvent(device.index), CudaEvent(device.index)

        def direct_between_events(_):
            began.record(stream.cuda_stream)
            direct.allReduce(x.data_ptr(), x.data_ptr(), x.numel(), nccl.NCCL_FLOAT32,
                             nccl.NCCL_SUM, stream.cuda_stream)
            done.record(stream.cuda_stream)
            sync()

        calls = {
            "nccl direct": lambda _: (direct.allReduce(x.data_ptr(), x.data_ptr(), x.numel(),
                                                       nccl.NCCL_FLOAT32, nccl.NCCL_SUM,
                                                       stream.cuda_stream), sync()),
            "direct + 2 events": direct_between_events,
            "ripples NcclCommunicator": lambda _: (ours.allreduce(x, x, "sum"), sync()),
            "NcclCommunicator unwatched": lambda _: (unwatched.allreduce(x, x, "sum"), sync()),
            "ripples allreduce_": lambda _: (hvd.allreduce_(x, op=hvd.Sum), sync()),
        }
        times = timing.interleaved(calls, args.iters, warmup=10)
        med = {name: stats.median(t) * 1e6 for name, t in times.items()}
        row = {"bytes": nbytes, **{f"{name} us": value for name, value in med.items()},
               "added us (NcclCommunicator - direct)":
                   med["ripples NcclCommunicator"] - med["nccl direct"]}
        rows.append(row)
        print(f"{nbytes:>8} {med['nccl direct']:>16.1f} {med['ripples NcclCommunicator']:>21.1f} "
              f"{med['NcclCommunicator unwatched']:>14.1f} {med['direct + 2 events']:>14.1f} "
              f"{med['ripples allreduce_']:>15.1f} "
              f"{row[list(row)[-1]]:>10.1f}")
    inits = []
    for _ in range(args.inits):
        uid = nccl.get_unique_id()
        start = time.perf_counter()
        comm = nccl.NcclCommunicator(1, uid, 0)
        inits.append(time.perf_counter() - start)
        comm.destroy()
    split = hasattr(nccl.NcclCommunicator, "commSplit")
    print(f"ncclCommInitRank (1 rank): median {stats.median(inits) * 1e3:.1f} ms of {args.inits}; "
          f"ncclCommSplit through cupy: {'available' if split else 'not exposed'}")
    splits = split_times(nccl, args.inits) if split else {}
    for name, times in splits.items():
        print(f"ncclCommSplit ({name}, 1 rank): median {stats.median(times) * 1e3:.2f} ms "
              f"of {len(times)}")
    ours.close()
    unwatched.close()
    dog.close()
    result = report.stamped({
        "benchmark": "gpu_nccl", "device_name": torch.cuda.get_device_name(device),
        "nccl": nccl_version(), "torch": torch.__version__, "iters": args.iters,
        "rows": rows, "init_rank_ms": [t * 1e3 for t in inits],
        "comm_split_exposed_by_cupy": split,
        **{f"split_{name}_ms": [t * 1e3 for t in times] for name, times in splits.items()},
    }, report.command_line(None if argv is None else ["benchmarks/gpu_nccl.py", *argv]))
    if args.json:
        report.write_json(args.json, result)
    return result


def split_times(nccl, count: int) -> dict:
    """Seconds of ``count`` ``ncclCommSplit`` calls of a one-rank parent, by setting:
    ``plain``, and ``shared`` (``split_share=1``: the child reuses the parent's resources)
    where cupy's ``NcclConfig`` takes it. A setting that fails is printed and left out."""
    parent = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
    settings = {"plain": None}
    config_type = getattr(nccl, "NcclConfig", None)
    if config_type is not None:
        try:
            settings["shared"] = config_type(split_share=1)
        except Exception as exc:  # an older cupy's NcclConfig takes other arguments
            print(f"NcclConfig(split_share=1) failed: {exc!r}")
    times: dict = {}
    for name, config in settings.items():
        try:
            for _ in range(count):
                start = time.perf_counter()
                child = (parent.commSplit(0, 0) if config is None
                         else parent.commSplit(0, 0, config))
                times.setdefault(name, []).append(time.perf_counter() - start)
                child.destroy()
        except Exception as exc:
            print(f"ncclCommSplit ({name}) failed: {exc!r}")
            times.pop(name, None)
    parent.destroy()
    return times


if __name__ == "__main__":
    main()
