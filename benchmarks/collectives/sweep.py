"""Timing one plug-in at one size: ripples and raw MPI in alternating blocks of ``-n``
iterations (``--rounds`` rounds, alternating which goes first); a block's time is the
slowest participating rank's, the row reports the medians over rounds."""
from __future__ import annotations

import time
from typing import Callable, Optional, Sequence

import numpy as np
from mpi4py import MPI

from .context import Context


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
        "time_us": t * 1e6, "algbw": gbps(plugin.nbytes, t),
        "busbw": gbps(plugin.nbytes, t) * plugin.factor(g),
        "wrong": int(wrong) if args.check else None,
        "ref_us": ref * 1e6, "ref_algbw": gbps(plugin.nbytes, ref),
        "ref_busbw": gbps(plugin.nbytes, ref) * plugin.factor(g),
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


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9 if seconds > 0 else float("nan")

