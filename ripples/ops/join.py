"""Horovod's ``join()`` for uneven amounts of work in all-reduce training."""
from __future__ import annotations

from ripples import runtime as _runtime
from ripples.comm.control import agree
from ripples.ops.reduction import participate_with_identity


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; returns the rank that joined last.

    Until every rank has joined, a joined rank takes part in the all-reduces the other
    ranks still run, contributing the op's identity (zeros for Sum and Average, and an
    Average divides by the number of ranks that have not joined). Only all-reduces may run
    while some ranks have joined. A joined rank waits at most ``Config.timeout_s`` for the
    others' next collective. In decentralized training, the rank first executes the groups
    already assigned to it and receives no more. ``device`` is accepted for Horovod
    compatibility.
    """
    rt = _runtime.current()
    for hook in rt.join_hooks:
        hook()
    rt.queue.flush()
    if rt.size == 1:
        return rt.rank
    rounds = 0
    while True:
        decision = agree(rt.ctl, rt.world_group, "join", "join", False, rt.config.timeout_s,
                         rt.config.stall_warning_s, join_rounds=rounds)
        if decision.last_joined >= 0:
            return decision.last_joined
        participate_with_identity(rt.world, decision.participate)
        rounds += 1
