"""The command line of the collectives benchmark, as nccl-tests spells it (``-b -e -f -w
-n -c -g -o``), and its checks."""
from __future__ import annotations

import argparse
from typing import List

OPS = ("allreduce", "partial_allreduce", "allgather", "broadcast")
SMALL_BYTES = 64 * 1024     # sizes at or below this count as latency-bound
LARGE_BYTES = 1024 * 1024   # sizes at or above this count as bandwidth-bound
MEMORY_BYTES = 4 * 1024 * 1024
ITEMSIZE = 4                # every buffer is float32
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from ``"8"``, ``"4K"``, ``"64M"`` or ``"1G"`` (binary multiples, as nccl-tests)."""
    text = str(text).strip().upper().removesuffix("B")
    unit = text[-1:] if text[-1:] in _UNITS and text[-1:] else ""
    number = text[:-1] if unit else text
    try:
        value = int(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"size {text!r} is not a byte count like 8, 4K, 64M or 1G") from None
    if value <= 0:
        raise ValueError(f"size {text!r} must be positive")
    return value


def size_sweep(begin: int, end: int, factor: int) -> List[int]:
    """``begin, begin*factor, ...`` up to ``end`` inclusive (as nccl-tests ``-b -e -f``)."""
    if begin > end:
        raise ValueError(f"-b ({begin}) must not exceed -e ({end})")
    if factor < 2 and begin != end:
        raise ValueError(f"-f must be >= 2 to sweep from -b to -e, got {factor}")
    sizes = [begin]
    while factor >= 2 and sizes[-1] * factor <= end:
        sizes.append(sizes[-1] * factor)
    return sizes


def parse_ops(text: str) -> List[str]:
    ops = [o.strip() for o in text.split(",") if o.strip()]
    unknown = [o for o in ops if o not in OPS]
    if unknown or not ops:
        raise ValueError(f"-o {text!r}: unknown operation(s) {unknown}; choose from {','.join(OPS)}")
    return ops


def build_parser(description: str = "") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("-b", "--minbytes", default="8", help="smallest size (e.g. 8, 4K)")
    p.add_argument("-e", "--maxbytes", default="64M", help="largest size (e.g. 16M)")
    p.add_argument("-f", "--stepfactor", type=int, default=4, help="size multiplication factor")
    p.add_argument("-w", "--warmup_iters", type=int, default=5, help="warm-up iterations per size")
    p.add_argument("-n", "--iters", type=int, default=20, help="iterations per timed block")
    p.add_argument("-c", "--check", type=int, default=1, help="1: check results (#wrong)")
    p.add_argument("-g", "--group", type=int, default=2, help="group size of partial_allreduce")
    p.add_argument("--split", action="store_true",
                   help="run disjoint groups of -g ranks at once (every rank in one group)")
    p.add_argument("-o", "--ops", default=",".join(OPS), help="comma-separated operations")
    p.add_argument("--rounds", type=int, default=5,
                   help="alternating ripples/raw rounds per size (medians are reported)")
    p.add_argument("--miss-samples", type=int, default=7,
                   help="fresh-group samples for the cache-miss cost (0 to skip)")
    p.add_argument("--memory", action="store_true",
                   help="compare numpy- and torch-allocated 4 MiB buffers with memcpy bandwidth")
    p.add_argument("--json", default="", help="write the results as JSON to this path")
    return p


def check_args(args, world: int) -> None:
    for name in ("iters", "rounds"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    for name in ("warmup_iters", "miss_samples"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 0, got {getattr(args, name)}")
    if not 1 <= args.group <= world:
        raise ValueError(f"-g {args.group}: the group size must be between 1 and the world size "
                         f"({world})")
    if args.split and world % args.group:
        raise ValueError(f"--split with -g {args.group}: the world size ({world}) must be a "
                         "multiple of the group size")

