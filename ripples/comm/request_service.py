"""Small requests from any rank, answered at once by a thread on one rank.

For state that ranks change one at a time, in any order, with no collective to carry it:
the shared work pool of ``ripples.torch.DistributedSampler`` (ranks draw the next part of
an epoch as they get to it). A request is a small picklable object sent over a private
communicator; the service thread on ``root`` calls ``handler(rank, request)`` and sends back
what it returns, or the exception it raised, which the caller raises. ``root``'s own
requests call the handler directly, under the same lock.

Why a thread and not MPI one-sided operations (``MPI_Fetch_and_op`` on a window): on the
emulated cluster (``shared/tools/netcluster``, 2 hosts), a fetch-and-add on a window whose
owner was computing, outside MPI, took up to the full 2 s of that computation, also from a
rank on the owner's host: Open MPI's one-sided operations across hosts progress only when
the owner calls into MPI. Under ULFM (``--fault-tolerant``) the shared-memory window
component also prints that it is not failure-safe. On one host the window took 2-5 us a
draw; the thread takes about a tenth of a millisecond, paid once per draw.

Between requests the thread sleeps in the kernel on a doorbell (``doorbell.py``) that every
caller rings after sending; without one (some rank could not make one) it naps, from
``MIN_NAP_S`` doubling to ``MAX_NAP_S``.
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, Optional

from ripples.comm import outbox
from ripples.comm.doorbell import Doorbell
from ripples.comm.failures import is_process_failure
from ripples.core.errors import RipplesError

log = logging.getLogger("ripples")

TAG_REQUEST = 0x5253
TAG_REPLY = 0x5254
MIN_NAP_S = 1e-4
MAX_NAP_S = 5e-3
BELL_GRACE_S = 2e-3  # polling after a ring: its MPI message may still be on the way


class RequestService:
    """``call(request)`` from any rank of ``comm``, answered by ``handler`` on ``root``.

    Construction and ``close()`` are collective over ``comm``, which the service owns (it
    frees it at ``close()``; pass a private duplicate). ``handler(rank, request)`` runs on
    ``root`` with one request at a time. Every wait is bounded by ``timeout_s``.
    """

    def __init__(self, comm, handler: Callable[[int, Any], Any], timeout_s: float,
                 root: int = 0, name: str = "request service"):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.size = comm.Get_size()
        self.root = root
        self.name = name
        self.timeout_s = timeout_s
        self._handler = handler
        self._lock = threading.Lock()
        self._request_id = 0
        self._closed = False
        self._stop = threading.Event()
        self._closed_ranks: set = set()
        self._sends: list = []
        self._doorbell = Doorbell.setup(comm, root)  # collective
        self._thread: Optional[threading.Thread] = None
        if self.rank == root:
            self._thread = threading.Thread(target=self._serve, name=f"ripples-{name}",
                                            daemon=True)
            self._thread.start()

    # ---------------------------------------------------------------- callers

    def call(self, request) -> Any:
        """The handler's answer to ``request`` (its exception raised here)."""
        if self._closed:
            raise RipplesError(f"rank {self.rank}: the {self.name} is closed")
        if self.rank == self.root:
            with self._lock:
                return self._handler(self.rank, request)
        status, answer = self._exchange("call", request)
        if status == "error":
            raise answer
        return answer

    def close(self) -> None:
        """Stop using the service; on ``root``, wait (at most ``timeout_s``) until every rank
        has closed, then stop the thread. Collective over ``comm``."""
        if self._closed:
            return
        try:
            if self.rank != self.root:
                self._exchange("close", None)
            else:
                self._closed_ranks.add(self.rank)
                deadline = time.monotonic() + self.timeout_s
                while self._thread.is_alive() and time.monotonic() < deadline:
                    self._thread.join(0.01)
                if self._thread.is_alive():
                    missing = sorted(set(range(self.size)) - self._closed_ranks)
                    log.warning("%s on rank %d: ranks %s did not close within %g s", self.name,
                                self.root, missing, self.timeout_s)
        finally:
            self._closed = True
            self._shut()
            self.comm.Free()

    def abandon(self) -> None:
        """Stop at once without talking to anyone (ranks died); the service is unusable."""
        self._closed = True
        self._shut()

    def _shut(self) -> None:
        self._stop.set()
        if self._doorbell is not None:
            self._doorbell.ring()
        if self._thread is not None:
            self._thread.join(1.0)
        if self._doorbell is not None:
            self._doorbell.close()
            self._doorbell = None

    def _exchange(self, op: str, request):
        from ripples.comm.mpi import Deadline, poll_until  # needs torch: load it when used
        self._request_id += 1
        request_id = self._request_id
        send = self.comm.isend((self.rank, request_id, op, request), dest=self.root,
                               tag=TAG_REQUEST)
        if self._doorbell is not None:
            self._doorbell.ring()
        reply = []

        def answered() -> bool:
            if not reply:
                msg = self.comm.improbe(source=self.root, tag=TAG_REPLY)
                if msg is not None:
                    answer = msg.recv()
                    if answer[0] == request_id:  # else: the late answer to a timed-out call
                        reply.append(answer[1:])
            return bool(reply) and send.Test()

        try:
            poll_until(answered, Deadline(
                self.timeout_s, self.timeout_s,
                lambda: f"{self.name} (rank {self.root}) did not answer {op!r} from rank "
                        f"{self.rank}"))
        except BaseException:
            outbox.keep_until_complete(send)  # may still be in flight to a late root
            raise
        return reply[0]

    # ---------------------------------------------------------------- the thread on root

    def _serve(self) -> None:
        try:
            self._serve_until_stopped()
        finally:
            outbox.keep_until_complete(*self._sends)  # stopped: answers still in flight
            self._sends = []

    def _serve_until_stopped(self) -> None:
        from mpi4py import MPI
        nap = MIN_NAP_S
        rung = time.monotonic()
        while not self._stop.is_set() and len(self._closed_ranks) < self.size:
            try:
                if self._sends:
                    self._sends = [req for req in self._sends if not _done(req)]
                if self._answer_one():
                    rung, nap = time.monotonic(), MIN_NAP_S
                    continue
            except MPI.Exception as exc:
                if exc.Get_error_class() == getattr(MPI, "ERR_REVOKED", None):
                    return  # the survivors are moving to a smaller world without this one
                if not is_process_failure(exc):
                    raise
                # A rank died (fault-tolerant mode): a receive from any source fails until
                # the death is acknowledged; the survivors' requests are still answered.
                self.comm.Ack_failed()
                continue
            quiet = time.monotonic() - rung >= BELL_GRACE_S
            if self._doorbell is not None and quiet and not self._sends:
                if self._doorbell.wait(None):
                    rung, nap = time.monotonic(), MIN_NAP_S
                continue
            time.sleep(nap)
            nap = min(MAX_NAP_S, nap * 2)
        while self._sends and not self._stop.is_set():
            self._sends = [req for req in self._sends if not _done(req)]
            time.sleep(MIN_NAP_S)

    def _answer_one(self) -> bool:
        from mpi4py import MPI
        # A probe that finds nothing still runs MPI's progress, which may only then take in
        # the message a ring announced: a second probe finds it without waiting for a nap.
        msg = (self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST)
               or self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST))
        if msg is None:
            return False
        rank, request_id, op, request = msg.recv()
        if op == "close":
            self._closed_ranks.add(rank)
            answer = ("ok", None)
        else:
            try:
                with self._lock:
                    answer = ("ok", self._handler(rank, request))
            except Exception as exc:  # the caller's error (e.g. a mismatch it caused)
                answer = ("error", exc)
        self._sends.append(self.comm.isend((request_id, *answer), dest=rank, tag=TAG_REPLY))
        return True


def _done(request) -> bool:
    """Whether a reply was sent; one to a rank that died counts as sent."""
    from mpi4py import MPI
    try:
        return request.Test()
    except MPI.Exception as exc:
        if is_process_failure(exc):
            return True
        raise
