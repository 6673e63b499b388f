"""The cost of the first ``partial_allreduce`` on a group whose communicator is not cached."""
from __future__ import annotations

from typing import Optional

import numpy as np
import torch

import ripples.torch as hvd
from ripples import runtime as ripples_runtime

from .context import Context
from .sweep import gather_rounds, timed_block


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
    # the ring makes no communicator
    made_per_miss = 0 if rt.config.ring_carries(tensor.numel() * tensor.element_size()) else 1
    miss, hit = [], []
    # A miss is the Python path's cost: a group's native lane would skip the cache.
    rt.engine.lanes.pause()
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
    rt.engine.lanes.pause(False)
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

