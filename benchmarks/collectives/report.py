"""What rank 0 prints and records: the nccl-tests table, the header (machine, MPI, load),
and the bars of BENCHMARKS.md as PASS/MISS (reports, not assertions)."""
from __future__ import annotations

import os
import platform
import statistics
import sys
from typing import List, Optional, Sequence

import numpy as np
import torch

from harness import report as stamp
from ripples import runtime as ripples_runtime

from .context import Context
from .options import LARGE_BYTES, SMALL_BYTES


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
    stamped = stamp.stamp()
    return {
        "date": stamped["date"],
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
        "group_allreduce": ripples_runtime.current().config.group_transport,
        "btl": os.environ.get("OMPI_MCA_btl", "default"),
        "command": stamped["command"],
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

