#!/usr/bin/env python
"""Collectives micro-benchmark in the style of nccl-tests: ripples side by side with raw MPI.

Run it under MPI, for example::

    mpiexec -n 4 --oversubscribe python benchmarks/collectives.py -b 8 -e 16M -f 4 -g 2 --split

For every collective and size it times the ripples call and the same collective issued
directly through mpi4py on the same ranks and the same kind of memory. The two are measured
in alternating blocks of ``-n`` iterations (``--rounds`` rounds, alternating which goes
first) and the medians over rounds are compared, so that noise on a shared machine hits
both alike. A block's time is the slowest participating rank's.

Columns follow nccl-tests: ``algbw = size / time``; ``busbw = algbw * factor`` with factor
``2(g-1)/g`` for an all-reduce over g ranks, ``(g-1)/g`` for allgather (size = gathered
bytes) and 1 for broadcast. ``ref(us)`` and ``ref_busbw`` are the raw mpi4py measurement,
``ratio`` is ripples throughput over raw throughput (raw time / ripples time).

Also reported: the latency ripples adds at sizes <= 64 KB on a cached group, the cost of the
first ``partial_allreduce`` on a group whose communicator is not cached (``--miss-samples``),
and with ``--memory`` the effect of transparent huge pages on a 4 MiB all-reduce
(numpy-allocated versus torch-allocated memory) next to ``numpy.copyto`` bandwidth. The bars
of BENCHMARKS.md are printed as PASS/MISS; they are reports, not assertions.

Rank 0 prints the table and writes ``--json PATH``. There is no compute in this benchmark:
it is pure communication.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from typing import Callable, List, Optional, Sequence, Tuple

import numpy as np
import torch
from mpi4py import MPI

import ripples.torch as hvd
from ripples import runtime as ripples_runtime

OPS = ("allreduce", "partial_allreduce", "allgather", "broadcast")
SMALL_BYTES = 64 * 1024     # sizes at or below this count as latency-bound
LARGE_BYTES = 1024 * 1024   # sizes at or above this count as bandwidth-bound
MEMORY_BYTES = 4 * 1024 * 1024
ITEMSIZE = 4                # every buffer is float32
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


# ---------------------------------------------------------------- arguments

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


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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


# ---------------------------------------------------------------- shared state

class Context:
    """The ranks' benchmark communicators, built once before any measurement.

    ``bench`` is a duplicate of the world used for barriers, timing reductions and raw
    world collectives; ``part_comm`` is the raw sub-communicator of this rank's
    partial_allreduce group (None when this rank is in no group).
    """

    def __init__(self, args):
        world = MPI.COMM_WORLD
        self.rank = world.Get_rank()
        self.size = world.Get_size()
        self.bench = world.Dup()
        self.world_group = tuple(range(self.size))
        g = args.group
        if args.split:
            self.part_groups = [tuple(range(s, s + g)) for s in range(0, self.size, g)]
        else:
            self.part_groups = [tuple(range(g))]
        mine = [grp for grp in self.part_groups if self.rank in grp]
        self.part_group: Optional[Tuple[int, ...]] = mine[0] if mine else None
        self.part_comm = None
        if self.part_group is not None:
            mpi_group = self.bench.Get_group().Incl(list(self.part_group))
            self.part_comm = self.bench.Create_group(mpi_group)
            mpi_group.Free()

    def close(self) -> None:
        if self.part_comm is not None:
            self.part_comm.Free()
        self.bench.Free()


def _pattern(count: int, scale: int) -> torch.Tensor:
    """Integer-valued float32 data ``scale * (i % 7 + 1)``: sums of it are exact."""
    return (torch.arange(count, dtype=torch.int64) % 7 + 1).to(torch.float32) * scale


# ---------------------------------------------------------------- plug-ins, one per collective
# A plug-in holds its buffers for one size and exposes ripples(), raw() and check(which).
# check returns the number of wrong elements of one fresh call (which = "ripples" or "raw").

class _Plugin:
    name = ""
    redop = "none"
    group: Tuple[int, ...] = ()
    comm = None

    def member(self, rank: int) -> bool:
        return rank in self.group

    @staticmethod
    def factor(g: int) -> float:
        raise NotImplementedError


class AllreducePlugin(_Plugin):
    """``hvd.allreduce_(t, op=Sum)`` against ``Allreduce(IN_PLACE)`` on a Dup of the world."""
    name = "allreduce"
    redop = "sum"

    def __init__(self, ctx: Context, nbytes: int):
        self.ctx = ctx
        self.group, self.comm = self._where(ctx)
        self.count = max(1, nbytes // ITEMSIZE)
        self.nbytes = self.count * ITEMSIZE
        # Zeros while timing: repeated in-place sums stay finite.
        self.tensor = torch.zeros(self.count)
        self.ref = torch.zeros(self.count).numpy()

    def _where(self, ctx):
        return ctx.world_group, ctx.bench

    @staticmethod
    def factor(g: int) -> float:
        return 2 * (g - 1) / g if g > 1 else 0.0

    def ripples(self) -> None:
        hvd.allreduce_(self.tensor, op=hvd.Sum)

    def raw(self) -> None:
        self.comm.Allreduce(MPI.IN_PLACE, self.ref, op=MPI.SUM)

    def check(self, which: str) -> int:
        data = _pattern(self.count, self.ctx.rank + 1)
        if which == "ripples":
            self._ripples_on(data)
        else:
            buf = data.numpy()
            self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        expected = _pattern(self.count, sum(r + 1 for r in self.group))
        return int((data != expected).sum())

    def _ripples_on(self, data: torch.Tensor) -> None:
        hvd.allreduce_(data, op=hvd.Sum)


class PartialAllreducePlugin(AllreducePlugin):
    """``hvd.partial_allreduce_(t, group, op=Sum)`` against raw ``Allreduce`` on a
    sub-communicator of the same ranks made once with ``Create_group``."""
    name = "partial_allreduce"

    def _where(self, ctx):
        return (ctx.part_group or ()), ctx.part_comm

    def ripples(self) -> None:
        hvd.partial_allreduce_(self.tensor, self.group, op=hvd.Sum)

    def _ripples_on(self, data: torch.Tensor) -> None:
        hvd.partial_allreduce_(data, self.group, op=hvd.Sum)


class AllgatherPlugin(_Plugin):
    """``hvd.allgather(t)`` against raw ``Allgather``; size is the gathered total."""
    name = "allgather"

    def __init__(self, ctx: Context, nbytes: int):
        self.ctx = ctx
        self.group, self.comm = ctx.world_group, ctx.bench
        g = len(self.group)
        self.per_rank = max(1, nbytes // (ITEMSIZE * g))
        self.count = self.per_rank * g
        self.nbytes = self.count * ITEMSIZE
        self.tensor = torch.zeros(self.per_rank)
        self.send = torch.zeros(self.per_rank).numpy()
        self.recv = torch.zeros(self.count).numpy()

    @staticmethod
    def factor(g: int) -> float:
        return (g - 1) / g

    def ripples(self) -> None:
        hvd.allgather(self.tensor)

    def raw(self) -> None:
        self.comm.Allgather(self.send, self.recv)

    def check(self, which: str) -> int:
        send = _pattern(self.per_rank, self.ctx.rank + 1)
        if which == "ripples":
            out = hvd.allgather(send)
        else:
            out = torch.zeros(self.count)
            self.comm.Allgather(send.numpy(), out.numpy())
        expected = torch.cat([_pattern(self.per_rank, r + 1) for r in self.group])
        if out.shape != expected.shape:
            return self.count
        return int((out != expected).sum())


class BroadcastPlugin(_Plugin):
    """``hvd.broadcast_(t, 0)`` against raw ``Bcast`` from rank 0."""
    name = "broadcast"

    def __init__(self, ctx: Context, nbytes: int):
        self.ctx = ctx
        self.group, self.comm = ctx.world_group, ctx.bench
        self.count = max(1, nbytes // ITEMSIZE)
        self.nbytes = self.count * ITEMSIZE
        self.tensor = torch.zeros(self.count)
        self.ref = torch.zeros(self.count).numpy()

    @staticmethod
    def factor(g: int) -> float:
        return 1.0

    def ripples(self) -> None:
        hvd.broadcast_(self.tensor, 0)

    def raw(self) -> None:
        self.comm.Bcast(self.ref, root=0)

    def check(self, which: str) -> int:
        data = _pattern(self.count, 3) if self.ctx.rank == 0 else torch.zeros(self.count)
        if which == "ripples":
            hvd.broadcast_(data, 0)
        else:
            self.comm.Bcast(data.numpy(), root=0)
        return int((data != _pattern(self.count, 3)).sum())


PLUGINS = {p.name: p for p in (AllreducePlugin, PartialAllreducePlugin, AllgatherPlugin,
                                BroadcastPlugin)}


# ---------------------------------------------------------------- measurement

def timed_block(ctx: Context, fn: Optional[Callable[[], None]], iters: int) -> float:
    """Seconds per iteration of ``fn`` after a world barrier (0 on a rank that sits out)."""
    ctx.bench.Barrier()
    if fn is None:
        return 0.0
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    return (time.perf_counter() - start) / iters


def alternating(ctx: Context, ripples_fn, raw_fn, iters: int, rounds: int):
    """Per-rank seconds per iteration of both, ``rounds`` times, alternating the order."""
    mine = {"ripples": [], "raw": []}
    for r in range(rounds):
        order = (("ripples", ripples_fn), ("raw", raw_fn))
        for which, fn in (order if r % 2 == 0 else order[::-1]):
            mine[which].append(timed_block(ctx, fn, iters))
    return mine


def gather_rounds(ctx: Context, mine: dict):
    """On rank 0: {which: array[rank, round]}; None elsewhere."""
    gathered = ctx.bench.gather(mine, root=0)
    if ctx.rank != 0:
        return None
    return {k: np.array([g[k] for g in gathered]) for k in mine}


def slowest(per_rank_rounds: np.ndarray, ranks: Sequence[int]) -> float:
    """Median over rounds of the slowest of ``ranks`` (seconds)."""
    return float(np.median(per_rank_rounds[list(ranks)].max(axis=0)))


def measure(ctx: Context, plugin, args) -> Optional[dict]:
    """Warm up, time, check; rank 0 returns the row (others None)."""
    member = plugin.member(ctx.rank)
    for _ in range(args.warmup_iters):
        if member:
            plugin.ripples()
            plugin.raw()
    mine = alternating(ctx, plugin.ripples if member else None, plugin.raw if member else None,
                       args.iters, args.rounds)
    wrong = ref_wrong = 0
    if args.check:
        ctx.bench.Barrier()
        if member:
            wrong = plugin.check("ripples")
            ref_wrong = plugin.check("raw")
    wrong = ctx.bench.reduce(wrong, op=MPI.SUM, root=0)
    ref_wrong = ctx.bench.reduce(ref_wrong, op=MPI.SUM, root=0)
    rounds = gather_rounds(ctx, mine)
    if ctx.rank != 0:
        return None
    groups = ctx.part_groups if plugin.name == "partial_allreduce" else [ctx.world_group]
    g = len(groups[0])
    ranks = sorted(r for grp in groups for r in grp)
    t, ref = slowest(rounds["ripples"], ranks), slowest(rounds["raw"], ranks)
    row = {
        "op": plugin.name, "size": plugin.nbytes, "count": plugin.count, "type": "float",
        "redop": plugin.redop, "group": g, "groups": len(groups),
        "time_us": t * 1e6, "algbw": _gbps(plugin.nbytes, t),
        "busbw": _gbps(plugin.nbytes, t) * plugin.factor(g),
        "wrong": int(wrong) if args.check else None,
        "ref_us": ref * 1e6, "ref_algbw": _gbps(plugin.nbytes, ref),
        "ref_busbw": _gbps(plugin.nbytes, ref) * plugin.factor(g),
        "ratio": ref / t if t > 0 else float("nan"),
        "added_us": (t - ref) * 1e6,
        "ref_wrong": int(ref_wrong) if args.check else None,
        "rounds_us": (rounds["ripples"][ranks].max(axis=0) * 1e6).round(3).tolist(),
        "ref_rounds_us": (rounds["raw"][ranks].max(axis=0) * 1e6).round(3).tolist(),
    }
    if len(groups) > 1:
        row["per_group_us"] = {str(grp): slowest(rounds["ripples"], grp) * 1e6 for grp in groups}
        row["aggregate_busbw"] = row["busbw"] * len(groups)
        row["ref_aggregate_busbw"] = row["ref_busbw"] * len(groups)
    return row


def _gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")


def cache_miss(ctx: Context, samples: int) -> Optional[dict]:
    """Cost of the first partial_allreduce (8 bytes) on a group whose communicator was just
    discarded by every member, next to the cached call that follows it."""
    group = ctx.part_group
    if len(ctx.part_groups[0]) == ctx.size or len(ctx.part_groups[0]) == 1:
        note = ("not measurable: the group is the whole world, which uses the world "
                "communicator and never misses" if len(ctx.part_groups[0]) > 1 else
                "group of one: no communication")
        return {"group": len(ctx.part_groups[0]), "note": note} if ctx.rank == 0 else None
    rt = ripples_runtime.current()
    tensor = torch.zeros(2)
    made_per_miss = 0 if rt.config.ring_groups else 1  # the ring makes no communicator
    miss, hit = [], []
    for _ in range(samples):
        if group is not None:
            rt.cache.discard(group)
        created = rt.cache.created
        miss.append(timed_block(ctx, (lambda: hvd.partial_allreduce_(tensor, group, op=hvd.Sum))
                                if group is not None else None, 1))
        made = rt.cache.created - created
        if group is not None and made != made_per_miss:
            raise RuntimeError(f"cache-miss sample made {made} group communicators")
        hit.append(timed_block(ctx, (lambda: hvd.partial_allreduce_(tensor, group, op=hvd.Sum))
                               if group is not None else None, 1))
    rounds = gather_rounds(ctx, {"miss": miss, "hit": hit})
    if ctx.rank != 0:
        return None
    ranks = sorted(r for grp in ctx.part_groups for r in grp)
    miss_s = rounds["miss"][ranks].max(axis=0)
    hit_s = rounds["hit"][ranks].max(axis=0)
    return {"group": len(ctx.part_groups[0]), "groups": len(ctx.part_groups),
            "samples": samples, "made_per_miss": made_per_miss,
            "miss_us": float(np.median(miss_s)) * 1e6,
            "hit_us": float(np.median(hit_s)) * 1e6,
            "miss_minus_hit_us": float(np.median(miss_s - hit_s)) * 1e6,
            "miss_samples_us": (miss_s * 1e6).round(1).tolist()}


def anon_huge_kb() -> Optional[int]:
    """This process's transparent huge page memory in kB (Linux), None where unknown."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def _allocate(kind: str, count: int) -> Tuple[np.ndarray, Optional[int]]:
    """A zeroed float32 buffer from numpy or torch, and the huge-page kB it added."""
    before = anon_huge_kb()
    buf = np.zeros(count, np.float32) if kind == "numpy" else torch.zeros(count).numpy()
    buf[:] = 0.0  # write every page so the kernel backs it now (zeros keep sums finite)
    after = anon_huge_kb()
    return buf, (after - before if before is not None and after is not None else None)


def memory_effect(ctx: Context, iters: int, rounds: int) -> Optional[dict]:
    """4 MiB in-place raw Allreduce over the world on numpy- vs torch-allocated memory, and
    ``numpy.copyto`` bandwidth of the same buffers (all ranks copy at once). numpy advises
    the kernel to use transparent huge pages for arrays of 4 MiB and more; torch does not."""
    count = MEMORY_BYTES // ITEMSIZE
    buffers, huge_kb = {}, {}
    for kind in ("numpy", "torch"):
        (a, huge_a), (b, huge_b) = _allocate(kind, count), _allocate(kind, count)
        buffers[kind] = (a, b)
        huge_kb[kind] = None if huge_a is None or huge_b is None else huge_a + huge_b
    results = {}
    for kind, (a, b) in buffers.items():
        def reduce(buf=a):
            ctx.bench.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

        def copy(src=a, dst=b):
            np.copyto(dst, src)
        for _ in range(3):
            reduce()
            copy()
        mine = alternating(ctx, reduce, copy, iters, rounds)  # "ripples" = reduce, "raw" = copy
        gathered = gather_rounds(ctx, mine)
        if ctx.rank == 0:
            t = slowest(gathered["ripples"], range(ctx.size))
            c = slowest(gathered["raw"], range(ctx.size))
            busbw = _gbps(MEMORY_BYTES, t) * AllreducePlugin.factor(ctx.size)
            results[kind] = {"allreduce_us": t * 1e6, "busbw": busbw,
                             "huge_page_kb_rank0": huge_kb[kind],
                             "memcpy_us": c * 1e6, "memcpy_gbps": _gbps(MEMORY_BYTES, c),
                             "busbw_over_memcpy": busbw / _gbps(MEMORY_BYTES, c)}
    if ctx.rank != 0:
        return None
    results["bytes"] = MEMORY_BYTES
    results["torch_over_numpy_time"] = (results["torch"]["allreduce_us"]
                                        / results["numpy"]["allreduce_us"])
    return results


# ---------------------------------------------------------------- report

COLUMNS = ("size", "count", "type", "redop", "group", "time(us)", "algbw(GB/s)", "busbw(GB/s)",
           "#wrong", "ref(us)", "ref_busbw", "ratio")
WIDTHS = (10, 10, 6, 5, 5, 10, 11, 11, 6, 10, 9, 6)


def format_row(row: dict) -> str:
    group = str(row["group"]) if row["groups"] == 1 else f"{row['group']}x{row['groups']}"
    wrong = "N/A" if row["wrong"] is None else str(row["wrong"])
    cells = (row["size"], row["count"], row["type"], row["redop"], group,
             f"{row['time_us']:.1f}", f"{row['algbw']:.3f}", f"{row['busbw']:.3f}", wrong,
             f"{row['ref_us']:.1f}", f"{row['ref_busbw']:.3f}", f"{row['ratio']:.3f}")
    return " ".join(str(c).rjust(w) for c, w in zip(cells, WIDTHS))


def header_info(ctx: Context, load_before: Sequence[float]) -> dict:
    """Machine, MPI library, world size and date; the load average before and after the run
    tells a reader how much else was competing for the cores."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
            thp = f.read().strip()
    except OSError:
        thp = "unknown"
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(), "machine": platform.machine(), "cores": os.cpu_count(),
        # Open MPI's version string ends in a NUL byte, which would make the text binary.
        "mpi_library": ripples_runtime.mpi_library().replace("\0", "").strip(),
        "mpi4py": __import__("mpi4py").__version__,
        "torch": torch.__version__, "numpy": np.__version__, "python": platform.python_version(),
        "world_size": ctx.size, "transparent_hugepage": thp,
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "compute": "no compute (pure communication)",
        # How groups all-reduce (Config.group_allreduce) and over which Open MPI transports.
        "group_allreduce": "ring" if ripples_runtime.current().config.ring_groups
        else "communicator",
        "btl": os.environ.get("OMPI_MCA_btl", "default"),
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
    }


def bars(rows: List[dict], miss: Optional[dict]) -> List[dict]:
    """The BENCHMARKS.md bars, each with its worst measured value and PASS/MISS/N/A."""
    out = []

    def add(name, values, ok, unit, bar):
        if not values:
            out.append({"bar": name, "target": bar, "value": None, "status": "N/A"})
            return
        worst = min(values) if unit == "x" else max(values)
        out.append({"bar": name, "target": bar, "value": worst, "unit": unit,
                    "status": "PASS" if ok(worst) else "MISS"})

    def pick(op, test, key):
        return [r[key] for r in rows if r["op"] == op and test(r["size"])]
    add("partial_allreduce throughput vs raw at >= 1 MB (worst size)",
        pick("partial_allreduce", lambda s: s >= LARGE_BYTES, "ratio"), lambda v: v >= 0.95,
        "x", ">= 0.95x")
    add("partial_allreduce added latency at <= 64 KB, cache hit (worst size)",
        pick("partial_allreduce", lambda s: s <= SMALL_BYTES, "added_us"), lambda v: v <= 20,
        "us", "<= 20 us")
    miss_values = [miss["miss_us"]] if miss and "miss_us" in miss else []
    add("partial_allreduce first call on a new group (cache miss, median)", miss_values,
        lambda v: v <= 5000, "us", "<= 5000 us for g <= 8")
    add("allreduce throughput vs raw at >= 1 MB (worst size)",
        pick("allreduce", lambda s: s >= LARGE_BYTES, "ratio"), lambda v: v >= 0.95, "x",
        ">= 0.95x")
    add("allreduce throughput vs raw, all sizes (worst size)",
        pick("allreduce", lambda s: True, "ratio"), lambda v: v >= 0.95, "x", ">= 0.95x")
    return out


def print_report(info, args, rows, miss, memory, results_bars) -> None:
    print(f"# ripples collectives benchmark  {info['date']}")
    print(f"# machine: {info['host']} {info['machine']}, {info['cores']} cores; "
          f"THP: {info['transparent_hugepage']}; load average before {info['loadavg_before']} "
          f"after {info['loadavg_after']}")
    print(f"# MPI: {info['mpi_library']} (mpi4py {info['mpi4py']}); world size {info['world_size']}")
    print(f"# compute: {info['compute']}")
    print(f"# groups all-reduce over: {info['group_allreduce']}; Open MPI btl: {info['btl']}")
    print(f"# command: {info['command']}")
    print(f"# {args.rounds} alternating rounds of {args.iters} iterations (+{args.warmup_iters} "
          "warm-up); time = median over rounds of the slowest rank; ratio = ref / time")
    for op in dict.fromkeys(r["op"] for r in rows):
        op_rows = [r for r in rows if r["op"] == op]
        print(f"#\n# {op}")
        print("#" + " ".join(c.rjust(w) for c, w in zip(COLUMNS, WIDTHS))[1:])
        for row in op_rows:
            print(format_row(row))
        small = [r["added_us"] for r in op_rows if r["size"] <= SMALL_BYTES]
        if small:
            print(f"# added latency at <= 64 KB: median {statistics.median(small):.1f} us, "
                  f"worst {max(small):.1f} us")
        if op_rows[0]["groups"] > 1:
            full = {r["size"]: r for r in rows if r["op"] == "allreduce"}
            print("# disjoint groups at once: size, per-group busbw, aggregate busbw, "
                  "full allreduce busbw of the same bytes")
            for r in op_rows:
                ref = full.get(r["size"])
                print(f"#   {r['size']:>10} {r['busbw']:.3f} {r['aggregate_busbw']:.3f} "
                      f"{ref['busbw'] if ref else float('nan'):.3f}")
    if miss is not None:
        print("#\n# cache miss (first partial_allreduce of 8 bytes on a group just discarded;"
              " over the ring no communicator is made)")
        if "miss_us" in miss:
            print(f"#   g={miss['group']} x{miss['groups']} groups, {miss['samples']} samples: "
                  f"miss {miss['miss_us']:.1f} us, hit {miss['hit_us']:.1f} us, "
                  f"miss - hit {miss['miss_minus_hit_us']:.1f} us")
        else:
            print(f"#   g={miss['group']}: {miss['note']}")
    if memory is not None:
        print("#\n# memory: raw in-place Allreduce of 4 MiB over the world, and numpy.copyto")
        for kind in ("numpy", "torch"):
            m = memory[kind]
            print(f"#   {kind:5} memory: allreduce {m['allreduce_us']:.1f} us "
                  f"busbw {m['busbw']:.3f} GB/s; memcpy {m['memcpy_us']:.1f} us "
                  f"{m['memcpy_gbps']:.3f} GB/s; busbw/memcpy {m['busbw_over_memcpy']:.3f}; "
                  f"huge pages {m['huge_page_kb_rank0']} kB of 8192 kB")
        print(f"#   torch/numpy all-reduce time: {memory['torch_over_numpy_time']:.2f}x")
    print("#\n# bars (reports, not assertions)")
    for b in results_bars:
        value = "n/a" if b["value"] is None else f"{b['value']:.3f}{b['unit']}"
        print(f"#   {b['status']:4}  {b['bar']}: {value} (bar {b['target']})")
    sys.stdout.flush()


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    hvd.init()
    check_args(args, MPI.COMM_WORLD.Get_size())
    sizes = size_sweep(parse_size(args.minbytes), parse_size(args.maxbytes), args.stepfactor)
    ops = parse_ops(args.ops)
    ctx = Context(args)
    load_before = os.getloadavg()
    # First, while the heap is fresh: once large buffers have been freed, glibc serves later
    # 4 MiB requests from already-mapped small pages and numpy's huge-page advice is moot.
    memory = memory_effect(ctx, args.iters, args.rounds) if args.memory else None
    rows = []
    for op in ops:
        for nbytes in sizes:
            row = measure(ctx, PLUGINS[op](ctx, nbytes), args)
            if row is not None:
                rows.append(row)
    miss = cache_miss(ctx, args.miss_samples) if ("partial_allreduce" in ops
                                                   and args.miss_samples) else None
    if ctx.rank == 0:
        info = header_info(ctx, load_before)
        results_bars = bars(rows, miss)
        print_report(info, args, rows, miss, memory, results_bars)
        if args.json:
            settings = {k: getattr(args, k) for k in vars(args)}
            settings["sizes"] = sizes
            with open(args.json, "w") as f:
                json.dump({"header": info, "settings": settings, "rows": rows,
                           "cache_miss": miss, "memory": memory, "bars": results_bars}, f,
                          indent=1)
    ctx.close()
    hvd.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
