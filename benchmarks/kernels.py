"""Bandwidth of ripples.kernels pack / unpack / scale_ against plain torch.

Each case packs `count` float32 tensors of `numel` elements into one buffer (scale 1 and
SCALE), unpacks it back, and scales the buffer in place. SCALE is -1: a real multiply that
repeated runs cannot drive into subnormals (which would time the FPU, not memory). Bandwidth counts bytes read plus
bytes written, from the median of `--iters` timed runs. Baselines measured in the same run:
on CPU `torch.cat` (+ `mul_`), on GPU a plain device-to-device copy of the buffer.

On GPU each op is timed two ways: one call followed by a synchronization (what a caller
that waits for every result sees: the host's launch cost plus the kernel), and `--burst`
calls queued back to back, then one synchronization, divided by `--burst` (the kernel's
own pace once launches overlap with the GPU's work, as in a training step that queues its
buckets without waiting). The burst is the bandwidth; the gap between the two is the
host's share of a call.

    python benchmarks/kernels.py [--device cpu|cuda] [--iters 30] [--burst 10] [--json PATH]
"""
from __future__ import annotations

import argparse
import platform

import torch

from harness import report, stats, timing
from ripples import kernels

SCALE = -1.0
CASES = [(160, 1024), (160, 16384), (32, 262144), (4, 4194304)]


def _timer(device: torch.device):
    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    return sync


def median_seconds(fns: dict, iters: int, sync) -> dict:
    """Median time of each function, run round-robin so that all of them see the same
    background load (the machines are shared; ratios must be side by side)."""
    calls = {name: (lambda _, fn=fn: fn()) for name, fn in fns.items()}
    times = timing.interleaved(calls, iters, warmup=1, after=sync)
    return {name: stats.median(t) for name, t in times.items()}


def burst_of(fn, burst: int):
    """``fn`` called ``burst`` times back to back, as one callable."""
    def run():
        for _ in range(burst):
            fn()
    return run


def run_case(count: int, numel: int, device: torch.device, iters: int, burst: int = 1) -> list:
    sync = _timer(device)
    tensors = [torch.randn(numel, device=device) for _ in range(count)]
    total = count * numel
    nbytes = total * 4
    buffer = torch.empty(total, device=device)
    other = torch.empty_like(buffer)
    ops = {
        "pack": lambda: kernels.pack(tensors, buffer),
        "pack*s": lambda: kernels.pack(tensors, buffer, SCALE),
        "unpack": lambda: kernels.unpack(buffer, tensors),
        "unpack*s": lambda: kernels.unpack(buffer, tensors, SCALE),
        "scale_": lambda: kernels.scale_(buffer, SCALE),
    }
    if device.type == "cuda":
        # Bandwidth against a plain copy; the per-launch overhead of many small tensors
        # against torch.cat (the alternative for pack), in the extra columns.
        baseline = {"d2d copy": lambda: other.copy_(buffer),
                    "torch.cat": lambda: torch.cat(tensors, out=other),
                    "torch.cat+mul_": lambda: torch.cat(tensors, out=other).mul_(SCALE)}
        compare = {name: "d2d copy" for name in ops}
        also = {"pack": "torch.cat", "pack*s": "torch.cat+mul_"}
    else:
        baseline = {"torch.cat": lambda: torch.cat(tensors, out=other),
                    "torch.cat+mul_": lambda: torch.cat(tensors, out=other).mul_(SCALE),
                    "mul_": lambda: other.mul_(SCALE)}
        compare = {"pack": "torch.cat", "pack*s": "torch.cat+mul_", "unpack": "torch.cat",
                   "unpack*s": "torch.cat+mul_", "scale_": "mul_"}
        also = {}
    timed = {**baseline, **ops}
    seconds = median_seconds(timed, iters, sync)
    queued = {}
    if burst > 1:
        queued = {name: t / burst for name, t in median_seconds(
            {name: burst_of(fn, burst) for name, fn in timed.items()}, iters, sync).items()}
    rows = []
    for name in ops:
        ref = compare[name]
        rows.append({
            "count": count, "numel": numel, "bytes": nbytes, "op": name,
            "time_us": seconds[name] * 1e6,
            "gbps": 2 * nbytes / seconds[name] / 1e9,
            "baseline": ref, "baseline_time_us": seconds[ref] * 1e6,
            "baseline_gbps": 2 * nbytes / seconds[ref] / 1e9,
            "ratio": stats.ratio(seconds[ref], seconds[name]),
        })
        if queued:
            rows[-1].update({"burst": burst, "burst_time_us": queued[name] * 1e6,
                             "burst_gbps": 2 * nbytes / queued[name] / 1e9,
                             "burst_baseline_time_us": queued[ref] * 1e6,
                             "burst_ratio": stats.ratio(queued[ref], queued[name])})
        if name in also:
            rows[-1].update({"other_baseline": also[name],
                             "other_baseline_time_us": seconds[also[name]] * 1e6,
                             "ratio_to_other": stats.ratio(seconds[also[name]], seconds[name])})
    return rows


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--burst", type=int, default=10,
                        help="calls queued back to back per timed run on GPU (1: none)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args(argv)
    if args.iters < 1:
        parser.error("--iters must be >= 1")
    if args.burst < 1:
        parser.error("--burst must be >= 1")
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda given but torch sees no CUDA device")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or platform.machine()
    path = "CUDA kernels" if device.type == "cuda" and kernels._cuda_kernels() else "torch reference"
    print(f"device: {device} ({name}), path: {path}, torch threads: {torch.get_num_threads()}, "
          f"compute: real (memory-bound copies)")
    print(f"{'tensors':>7} {'numel':>9} {'MB':>7} {'op':>12} {'time(us)':>10} {'GB/s':>7} "
          f"{'baseline':>15} {'GB/s':>7} {'speed vs base':>13}")
    rows = []
    burst = args.burst if device.type == "cuda" else 1
    for count, numel in CASES:
        for row in run_case(count, numel, device, args.iters, burst):
            rows.append(row)
            print(f"{row['count']:>7} {row['numel']:>9} {row['bytes'] / 1e6:>7.1f} {row['op']:>12} "
                  f"{row['time_us']:>10.1f} {row['gbps']:>7.2f} {row['baseline']:>15} "
                  f"{row['baseline_gbps']:>7.2f} {row['ratio']:>12.2f}x"
                  + (f"  ({row['other_baseline']}: {row['other_baseline_time_us']:.1f} us, "
                     f"{row['ratio_to_other']:.2f}x)" if "other_baseline" in row else "")
                  + (f"  [{burst} queued: {row['burst_time_us']:.1f} us, {row['burst_gbps']:.0f} GB/s, "
                     f"{row['burst_ratio']:.2f}x the copy's]" if "burst_ratio" in row else ""))
    result = report.stamped({
        "benchmark": "kernels", "device": str(device), "device_name": name, "path": path,
        "torch": torch.__version__, "threads": torch.get_num_threads(), "iters": args.iters, "burst": burst,
        "rows": rows,
    }, report.command_line(None if argv is None else ["benchmarks/kernels.py", *argv]))
    if args.json:
        report.write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
