"""Requests nobody waits for (sends, a collective given up on), kept until they complete.

MPI reads and writes a non-blocking call's buffers until its request completes. mpi4py's
request of a send holds the send's buffer (for ``isend``, the pickled object), but a request
of a non-blocking collective (``Iallreduce``) holds none. A buffer freed while MPI still
uses it makes the receiver get garbage, or crashes the process. Measured with Open MPI 5:
``isend`` of 200 KB with its request dropped reached its receiver as an unpicklable
message, or the sender died with a segmentation fault, and so did an ``Iallreduce`` of
800 KB whose send buffer was freed before the last member called it. A small message to a
peer not yet connected (across hosts) or cut off is not sent at once either.
``keep_until_complete`` holds such requests, and the buffers they use, until they complete.
"""
from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any, List, Sequence, Tuple

if TYPE_CHECKING:
    from mpi4py import MPI

_MIN_PRUNE_AT = 32  # pending requests kept before finished ones are looked for
_lock = threading.Lock()
_pending: List[Tuple[MPI.Request, Sequence[Any]]] = []
_prune_at = _MIN_PRUNE_AT  # twice what the last look left: sends that never complete (to a
                           # silent peer) do not make every call look through them all


def keep_until_complete(*requests: MPI.Request, buffers: Sequence[Any] = ()) -> None:
    """Let ``requests`` (sends, or a collective this rank gave up waiting for) complete in
    the background, keeping ``buffers`` (the arrays they read or write) alive until then.
    The caller must not use the requests again: another thread may test them."""
    with _lock:
        if len(_pending) >= _prune_at:
            _release_completed()
        _pending.extend((request, buffers) for request in requests)


def release_completed() -> None:
    """Drop the kept requests that have completed, and their buffers (which may be whole
    models): call it now and then when nothing else would."""
    with _lock:
        _release_completed()


def _release_completed() -> None:
    global _prune_at
    _pending[:] = [kept for kept in _pending if not _finished(kept[0])]
    _prune_at = max(_MIN_PRUNE_AT, 2 * len(_pending))


def withdraw(*receives: MPI.Request, buffers: Sequence[Any] = ()) -> None:
    """Cancel ``receives`` this rank no longer waits for, and keep them, and ``buffers``
    (where a message matched before the cancel still lands), until they complete. Not for
    receives from any source: after a death such a receive fails and stays pending."""
    from mpi4py import MPI  # here: importing this module must not initialize MPI
    for request in receives:
        try:
            request.Cancel()
        except MPI.Exception:  # complete already, or its peer died
            pass
    keep_until_complete(*receives, buffers=buffers)


def _finished(request: MPI.Request) -> bool:
    from mpi4py import MPI
    if MPI.Is_finalized():
        return True
    try:
        return request.Test()
    except MPI.Exception:  # its peer died (fault tolerant): MPI uses the buffers no more
        return True
