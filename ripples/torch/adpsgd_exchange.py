"""AD-PSGD's pairwise model averaging over point-to-point messages: the active side's
:func:`exchange` and :func:`finish`, and the passive side's :class:`Responder` thread.

Protocol, on a communicator used for nothing else:

- An exchange: the active rank sends a header ``[EXCHANGE, layout, count, index]``
  (``TAG_HEADER``) and its ``count`` tensors (``TAG_DATA``). The passive rank's responder
  receives them, replaces its own tensors by the mean ``(own + theirs) / 2``, and answers
  a status (``TAG_STATUS``) and, when the layouts agree, its averaged tensors
  (``TAG_AVERAGE``), which the active rank copies into its own.
  The responder receives without the passive's model lock, then, holding it, replaces the
  passive's tensors by the mean and copies the mean into the buffers it sends: both end
  holding the same values, bit for bit, the averaging is atomic with respect to the
  passive's steps, and a step waits at most for one averaging, never for a transfer.
- The end: every active rank sends a header ``[DONE, 0, 0, exchanges]`` to every passive
  rank. A responder stops after a DONE from every active rank. Messages from one rank to
  another on one tag arrive in order, so a DONE comes after that rank's last exchange, and
  no message is left unmatched.

The responder serves one active rank at a time, in arrival order. Waits poll against a
deadline (``Config.timeout_s``) and name the peer they wait for, so a dead or stuck peer
gives a :class:`RipplesTimeoutError`, never a hang. A blocking MPI receive would spin in
Open MPI's progress loop and take the core the passive rank computes on, so an idle
responder sleeps instead: on a doorbell (``ripples.comm.doorbell``) that the active rank
rings after sending its header, once it has polled for ``BELL_GRACE_S`` without a header;
without a doorbell (some rank could not make one) it naps between polls, doubling up to
``MAX_NAP_S``.
"""
from __future__ import annotations

import threading
import time
import zlib
from typing import Callable, List, Optional, Sequence

import numpy as np
import torch
from mpi4py import MPI

from ripples.comm import outbox
from ripples.comm.doorbell import Doorbell
from ripples.comm.mpi import Deadline, as_buffer, wait_all, wait_sends
from ripples.core.errors import MismatchError, RipplesError, RipplesTimeoutError

TAG_HEADER, TAG_DATA, TAG_STATUS, TAG_AVERAGE = 0x4144, 0x4145, 0x4146, 0x4147
EXCHANGE, DONE = 1, 2
OK, MISMATCH = 0, 1
MAX_NAP_S = 1e-3
# Polling before sleeping on the doorbell: the next header often follows soon (a served
# exchange, a ring that came before its MPI message could be matched).
BELL_GRACE_S = 2e-3


def layout_of(tensors: Sequence[torch.Tensor]) -> int:
    """A 31-bit digest of the dtypes and sizes of ``tensors`` (both sides must agree)."""
    text = ";".join(f"{t.dtype}:{t.numel()}" for t in tensors)
    return zlib.crc32(text.encode()) & 0x7FFFFFFF


def _host(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous CPU tensor MPI can read and write: ``tensor`` itself when it is one
    (``tensor`` must not require grad: the exchange writes into it)."""
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        return tensor
    return tensor.detach().to("cpu", memory_format=torch.contiguous_format)


def _average_into(own: torch.Tensor, other: torch.Tensor) -> None:
    """``own <- (own + other) / 2`` in place (16-bit floats computed in float32)."""
    if own.dtype.is_floating_point and own.element_size() < 4:
        own.copy_(own.float().add_(other.to(own.device).float()).mul_(0.5))
    else:
        own.add_(other.to(own.device)).mul_(0.5)


def exchange(comm: MPI.Comm, rank: int, partner: int, tensors: List[torch.Tensor], index: int,
             timeout_s: float, stall_s: float, doorbell: Optional[Doorbell] = None,
             liveness=None) -> None:
    """Average ``tensors`` (this active rank's, written in place) with passive ``partner``'s
    (ringing its ``doorbell``, when there is one, once the header is on its way).

    Returns once both ranks hold the mean. Raises ``MismatchError`` when the partner lays
    out different tensors, ``RipplesTimeoutError`` naming the partner (``missing``) when it
    does not answer within ``timeout_s``; with ``liveness`` (``comm`` a copy of the world)
    only once it is not alive and busy either, ``PeersSilentError`` when it is silent."""
    hosts = [_host(t) for t in tensors]
    header = np.array([EXCHANGE, layout_of(tensors), len(tensors), index], dtype=np.int64)
    status = np.zeros(1, dtype=np.int64)
    deadline = Deadline(timeout_s, stall_s, lambda: (
        f"rank {rank}: AD-PSGD exchange {index} with passive rank {partner}"),
        lambda: [partner], liveness)
    sends = [comm.Isend(header, partner, TAG_HEADER)]
    sends += [comm.Isend(as_buffer(h), partner, TAG_DATA) for h in hosts]
    if doorbell is not None:
        doorbell.ring(partner)
    replies = [comm.Irecv(status, partner, TAG_STATUS)]
    try:
        # The averages land in the buffers being sent: receive them only once sent.
        wait_all(sends + replies, deadline)
        if status[0] != OK:
            raise MismatchError(
                f"rank {rank}: passive rank {partner} averages different tensors (dtypes or "
                "sizes) than this rank; every rank must train the same model")
        replies = [comm.Irecv(as_buffer(h), partner, TAG_AVERAGE) for h in hosts]
        wait_all(replies, deadline)
    except RipplesTimeoutError:
        outbox.withdraw(*replies, buffers=(status, hosts))
        outbox.keep_until_complete(*sends, buffers=(header,))  # may still be on its way
        raise
    for tensor, host in zip(tensors, hosts):
        if host is not tensor:
            tensor.copy_(host)


def finish(comm: MPI.Comm, rank: int, passives: Sequence[int], exchanges: int,
           timeout_s: float, stall_s: float, doorbell: Optional[Doorbell] = None) -> None:
    """Tell every passive rank that this active rank sends no more exchanges."""
    header = np.array([DONE, 0, 0, exchanges], dtype=np.int64)
    sends = [comm.Isend(header, p, TAG_HEADER) for p in passives]
    if doorbell is not None:
        for passive in passives:
            doorbell.ring(passive)
    wait_sends(sends, Deadline(timeout_s, stall_s, lambda: (
        f"rank {rank}: AD-PSGD end notice to passive ranks {list(passives)}")))


class Responder:
    """The passive rank's server of exchanges: a thread that answers the active ranks,
    one at a time, until each has sent DONE.

    ``tensors()`` gives the passive's current tensors; it is called, and they are averaged,
    with ``lock`` held (the passive's optimizer step holds it too). ``on_exchange(active)``
    is called after each exchange served, still under the lock. ``served``: exchanges
    served so far. An error on the thread (a peer that stopped mid-exchange, a layout
    mismatch) is kept in ``error`` and raised by :meth:`check` and :meth:`wait`. With a
    ``doorbell`` (this rank one of its services) the idle thread sleeps on it.
    """

    def __init__(self, comm: MPI.Comm, rank: int, actives: Sequence[int], lock: threading.Lock,
                 tensors: Callable[[], List[torch.Tensor]],
                 on_exchange: Callable[[int], None], timeout_s: float, stall_s: float,
                 liveness=None, doorbell: Optional[Doorbell] = None):
        self.comm = comm
        self.rank = rank
        self.lock = lock
        self.served = 0
        self.error: Optional[BaseException] = None
        self._pending = set(actives)
        self._tensors = tensors
        self._on_exchange = on_exchange
        self._timeout_s = timeout_s
        self._stall_s = stall_s
        self._liveness = liveness  # asked at the deadline whether silent actives are busy
        self._doorbell = doorbell
        self.wakeups = 0  # sleeps that ended (naps and doorbell waits)
        self._stop = threading.Event()
        self._header = np.zeros(4, dtype=np.int64)
        self._thread = threading.Thread(target=self._run, name=f"ripples-adpsgd-{rank}",
                                        daemon=True)
        self._started = False

    def start(self) -> None:
        """Start answering (once; later calls do nothing)."""
        if not self._started:
            self._started = True
            self._thread.start()

    def check(self) -> None:
        """Raise the error the responder stopped on, if any."""
        if self.error is not None:
            raise self.error

    def wait(self) -> None:
        """Wait until every active rank has sent DONE and been answered. The deadline
        (``timeout_s``) restarts whenever an exchange or a DONE arrives, so active ranks
        still training keep this rank waiting; one silent for ``timeout_s`` raises
        ``RipplesTimeoutError`` naming it, and the responder stops (with ``liveness``: only
        when it is not alive and busy, see ``ripples.comm.liveness``)."""
        self.start()
        watch = self.watch()
        if self._liveness is not None:
            self._liveness.enter()
        try:
            while self._thread.is_alive():
                self._thread.join(0.01)
                watch()
        finally:
            if self._liveness is not None:
                self._liveness.leave()
        self.check()

    def watch(self) -> Callable[[], None]:
        """A check to call now and then while the active ranks are expected to end: it
        raises the error the responder stopped on, or, once none of them exchanged or ended
        for ``timeout_s``, ``RipplesTimeoutError`` naming them (and stops the responder);
        ``wait`` runs it in a loop, a passive rank in ``join()`` between its rounds."""
        deadline = Deadline(self._timeout_s, self._stall_s, lambda: (
            f"rank {self.rank}: AD-PSGD passive waiting for active rank(s) "
            f"{sorted(self._pending)} to finish (they neither exchanged nor ended)"),
            lambda: sorted(self._pending), self._liveness)
        seen = [(self.served, len(self._pending))]

        def check() -> None:
            if not self._thread.is_alive():
                self.check()
                return
            now = (self.served, len(self._pending))
            if now != seen[0]:
                seen[0] = now
                deadline.restart()
            try:
                deadline.check()
            except RipplesTimeoutError:
                self.stop()
                raise
        return check

    def stop(self) -> None:
        """Stop answering now (cancels the pending receive) and wait for the thread."""
        self._stop.set()
        if self._doorbell is not None:
            self._doorbell.ring(self.rank)  # the thread may be asleep on it
        if self._started:
            self._thread.join()

    # ---------------------------------------------------------------- the thread

    def _run(self) -> None:
        try:
            while self._pending:
                source = self._next_header()
                if source is None:
                    return
                kind, layout, count, index = (int(v) for v in self._header)
                if kind == DONE:
                    self._pending.discard(source)
                elif kind == EXCHANGE:
                    self._serve(source, layout, count, index)
                else:
                    raise RipplesError(f"rank {self.rank}: AD-PSGD header of unknown kind "
                                       f"{kind} from rank {source}")
        except BaseException as exc:  # kept for the training thread, which raises it
            self.error = exc

    def _next_header(self) -> Optional[int]:
        status = MPI.Status()
        request = self.comm.Irecv(self._header, MPI.ANY_SOURCE, TAG_HEADER)
        pause = 0.0
        polling_since = time.monotonic()
        while not request.Test(status):
            if self._stop.is_set():
                request.Cancel()
                request.Wait()
                return None
            self.wakeups += 1
            if self._doorbell is not None and time.monotonic() - polling_since >= BELL_GRACE_S:
                if self._doorbell.wait(None):
                    pause, polling_since = 0.0, time.monotonic()
                continue
            pause = min(MAX_NAP_S, pause * 2 or 2e-5)
            self._stop.wait(pause)
        return status.Get_source()

    def _serve(self, source: int, layout: int, count: int, index: int) -> None:
        deadline = Deadline(self._timeout_s, self._stall_s, lambda: (
            f"rank {self.rank}: AD-PSGD exchange {index} with active rank {source}"),
            lambda: [source])
        # The lock is held only to read the layout and to average, never across a
        # transfer: the passive's own step waits for an averaging, not for the network
        # (with 2 MB over 100 Mbit/s a transfer each way takes 0.17 s).
        with self.lock:
            tensors = self._tensors()
            agreed = layout == layout_of(tensors) and count == len(tensors)
            theirs = [torch.empty(t.shape, dtype=t.dtype) for t in tensors] if agreed else []
        if not agreed:
            self._refuse(source, count, deadline)
            return
        receives = [self.comm.Irecv(as_buffer(t), source, TAG_DATA) for t in theirs]
        try:
            wait_all(receives, deadline)
        except RipplesTimeoutError:
            outbox.withdraw(*receives, buffers=(theirs,))
            raise
        with self.lock:
            tensors = self._tensors()  # as laid out now (a step may have laid them out anew)
            if layout != layout_of(tensors) or count != len(tensors):
                self._refuse(source, 0, deadline)
                return
            for tensor, other in zip(tensors, theirs):
                host = _host(tensor)
                _average_into(host, other)
                if host is not tensor:
                    tensor.copy_(host)
                other.copy_(host)  # the mean as it is now, sent while the step goes on
            self.served += 1
            self._on_exchange(source)
        sends = [self.comm.Isend(np.array([OK], dtype=np.int64), source, TAG_STATUS)]
        sends += [self.comm.Isend(as_buffer(t), source, TAG_AVERAGE) for t in theirs]
        wait_sends(sends, deadline)

    def _refuse(self, source: int, count: int, deadline: Deadline) -> None:
        """Answer an exchange whose tensors differ from this rank's (after receiving and
        dropping the ``count`` still on the way), and keep the error for the training
        thread."""
        self._drain(source, count, deadline)
        wait_sends([self.comm.Isend(np.array([MISMATCH], dtype=np.int64), source, TAG_STATUS)],
                   deadline)
        self.error = MismatchError(
            f"rank {self.rank}: active rank {source} averages different tensors "
            "(dtypes or sizes) than this rank; every rank must train the same model")

    def _drain(self, source: int, count: int, deadline: Deadline) -> None:
        """Receive (and drop) the ``count`` tensors of an exchange that cannot be served."""
        for _ in range(count):
            status = MPI.Status()
            while not self.comm.Iprobe(source, TAG_DATA, status):
                deadline.check()
                time.sleep(1e-4)
            self.comm.Recv(bytearray(status.Get_count(MPI.BYTE)), source, TAG_DATA)
