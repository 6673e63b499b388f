"""A bounded ``ncclCommInitRank``.

NCCL's blocking init waits for every member of the new communicator with no deadline: a
member that died, or never asks for it, leaves the others waiting for good. cupy's
``NcclConfig`` sets only ``split_share``, not NCCL's non-blocking mode (whose init could be
polled and aborted), so the init runs on a helper thread (cupy releases the GIL inside it)
and the caller waits at most ``timeout_s``. Past it the caller raises
``RipplesTimeoutError`` naming the communicator; one that completes later anyway is
destroyed by the helper, unused (its members time out on their first operation, under the
watchdog, instead of waiting for good).
"""
from __future__ import annotations

import threading
from typing import Callable, Optional

from ..core.errors import RipplesTimeoutError


def bounded_init(make: Callable[[], object], timeout_s: Optional[float], what: str):
    """``make()`` (which builds an NCCL communicator, collectively) within ``timeout_s``
    seconds, else ``RipplesTimeoutError`` naming ``what``; ``timeout_s=None`` waits as long
    as ``make`` does, on the caller's thread. ``make``'s own exception is raised as is."""
    if timeout_s is None:
        return make()
    lock, finished = threading.Lock(), threading.Event()
    outcome: dict = {}

    def run() -> None:
        try:
            comm = make()
        except BaseException as exc:  # handed to the caller, who raises it
            with lock:
                outcome["error"] = exc
            finished.set()
            return
        with lock:
            outcome["comm"] = comm
            abandoned = outcome.get("abandoned", False)
        finished.set()
        if abandoned:
            comm.destroy()

    threading.Thread(target=run, name="ripples-nccl-init", daemon=True).start()
    finished.wait(timeout_s)
    with lock:
        if not ("comm" in outcome or "error" in outcome):
            outcome["abandoned"] = True
            raise RipplesTimeoutError(
                f"{what}: ncclCommInitRank did not complete within {timeout_s:.1f} s (a "
                "member dead, or not building this communicator?)")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["comm"]
