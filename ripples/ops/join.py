"""Horovod's ``join()`` for uneven amounts of work in all-reduce training."""
from __future__ import annotations

from ripples import runtime as _runtime
from ripples.core.errors import RanksFailedError


def join(device: int = -1) -> int:
    """Declare that this rank has no more data; returns the rank that joined last.

    Until every rank has joined, a joined rank takes part in the collectives the other
    ranks still run: all-reduces (contributing the op's identity: zeros for Sum and
    Average, and an Average divides by the number of ranks that have not joined),
    all-gathers (contributing no rows) and broadcasts (receiving); any other collective
    raises ``MismatchError`` on the active ranks. A joined rank waits at most
    ``Config.timeout_s`` for the others' next collective. In decentralized training, the rank first executes the groups
    already assigned to it and receives no more. ``device`` is accepted for Horovod
    compatibility.
    """
    rt = _runtime.current()
    while True:
        try:
            for hook in rt.join_hooks:
                hook()
            last = rt.engine.join()
            for hook in rt.joined_hooks:
                hook()
            return last
        except Exception as exc:
            error = rt.raised(exc)
            if not isinstance(error, RanksFailedError):
                raise error from exc
            # Dead ranks (fault-tolerant mode): the survivors join again on the new world.
