"""Sends that nobody waits for, kept until they complete.

The request of an mpi4py non-blocking send holds the send's buffer (for ``isend``, the
pickled object). A request dropped while MPI still sends from it frees that buffer under
MPI: the receiver gets garbage, or the sender crashes. Measured: ``isend`` of 200 KB with the
request dropped reached its receiver as an unpicklable message, or the sender died with a
segmentation fault; a small message to a peer not yet connected (across hosts) or cut off
is not sent at once either. ``keep_until_sent`` holds such requests until they complete.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, List

if TYPE_CHECKING:
    from mpi4py import MPI

_PRUNE_AT = 32  # pending requests kept before finished ones are looked for
_lock = threading.Lock()
_pending: List[MPI.Request] = []


def keep_until_sent(*requests: MPI.Request) -> None:
    """Let ``requests`` (sends) complete in the background. The caller must not use them
    again: another thread may test them."""
    with _lock:
        if len(_pending) >= _PRUNE_AT:
            _pending[:] = [r for r in _pending if not _finished(r)]
        _pending.extend(requests)


def pending() -> int:
    """How many kept sends have not been seen to complete."""
    with _lock:
        _pending[:] = [r for r in _pending if not _finished(r)]
        return len(_pending)


def _finished(request: MPI.Request) -> bool:
    from mpi4py import MPI  # here: importing this module must not initialize MPI
    try:
        return request.Test()
    except MPI.Exception:  # its peer died (fault tolerant): MPI reads the buffer no more
        return True
