"""Bounded waits for NCCL work: a watchdog that aborts a communicator whose operation has
run past its deadline.

An NCCL call returns once its work is enqueued on a stream. If a member died, or never
launches its half, the kernel waits forever, and so does everything queued behind it on
the stream and any host wait on it. So each enqueued operation is tracked by two CUDA
events, one recorded just before it and one just after. The watchdog polls them:

- The clock of an operation starts when its ``began`` event is first seen complete, that
  is, when this GPU reached the operation. Compute queued ahead of it on the stream does
  not count: a busy GPU is slow, not dead. A peer's GPU still busy with work queued before
  its half does count, so ``timeout_s`` must exceed the GPU time by which a rank can lag
  behind its peers.
- When its ``done`` event is still pending ``timeout_s`` after that, the watchdog calls the
  communicator's ``abort`` (``ncclCommAbort``: the pending kernels return and the stream
  moves on). It records a ``RipplesTimeoutError`` naming the operation, the communicator
  and the wait, and drops that communicator's other pending operations.
- ``raise_if_failed(owner)`` raises the recorded error. The communicator calls it before
  each new operation, so the next collective on the group fails clearly instead of hanging.
  The error stays recorded while the aborted communicator exists (it cannot be used
  again); ``forget(owner)``, called when it is closed, drops it, so that a communicator
  built later for the same group starts clean.

A completed operation's two events go back to its communicator's free list (filled by a
pass, and by ``track``, which takes back the communicator's oldest operation once done),
and ``reusable_events`` hands them to its next operation to record again: creating and
destroying two CUDA events per call cost more than recording them.

Polling runs on one daemon thread, started with the first tracked operation: it waits on a
condition while nothing is tracked, and makes a pass ``poll_s`` after work arrives and
every ``poll_s`` while any is pending; new work wakes it only from its untimed wait, never
once per operation (waking the thread takes the GIL from the caller). The clock and
the events are injected (``clock``, objects with ``query()``), so the logic is tested
without a GPU; ``check()`` is one pass, for tests and for the thread.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Callable, Deque, Dict, List, Optional

from ..core.errors import RipplesTimeoutError


@dataclasses.dataclass
class Pending:
    """One enqueued operation: its name, its communicator (``owner``) and that
    communicator's label for messages, its events and the abort."""

    what: str
    owner: object
    label: str
    began: object  # has query() -> bool (a ripples.kernels.streams.CudaEvent)
    done: object
    abort: Callable[[], None]
    started_at: Optional[float] = None  # when ``began`` was first seen complete


class NcclWatchdog:
    """Tracks enqueued NCCL operations and aborts those past ``timeout_s`` (see the module
    docstring)."""

    MAX_FREE_EVENTS = 64  # pairs kept per communicator; a burst beyond it makes new ones

    def __init__(self, timeout_s: float, clock: Callable[[], float] = time.monotonic,
                 poll_s: float = 0.05, start_thread: bool = True):
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s!r}")
        self.timeout_s = timeout_s
        self.clock = clock
        self.poll_s = poll_s
        self.start_thread = start_thread
        self.pending: List[Pending] = []
        self.failures: Dict[object, RipplesTimeoutError] = {}  # by owner
        self.free: Dict[object, Deque[tuple]] = {}  # by owner: completed (began, done) pairs
        # A plain lock: nothing takes it twice, and an RLock costs more on every call.
        self._cond = threading.Condition(threading.Lock())
        self._thread: Optional[threading.Thread] = None
        self._closed = False
        self._asleep = False  # the thread waits for work with no time limit

    def track(self, what: str, owner, label: str, began, done,
              abort: Callable[[], None]) -> None:
        """Watch one operation of communicator ``owner`` (named ``label`` in errors),
        enqueued between events ``began`` and ``done``."""
        with self._cond:
            pending = self.pending
            # A caller that waits for each result outruns the passes (poll_s apart): take
            # back its oldest operation here once it is done, for its next call's events.
            for index, op in enumerate(pending):
                if op.owner is owner:
                    if op.done.query():
                        del pending[index]
                        self._free(op)
                    break
            pending.append(Pending(what, owner, label, began, done, abort))
            if self.start_thread and self._thread is None and not self._closed:
                self._thread = threading.Thread(target=self._run, name="ripples-nccl-watchdog",
                                                daemon=True)
                self._thread.start()
            if self._asleep:  # else the thread looks at it anyway within poll_s (see _run)
                self._cond.notify()

    def reusable_events(self, owner) -> Optional[tuple]:
        """A ``(began, done)`` pair of a completed operation of ``owner`` to record again,
        or None (then the caller makes new events). Both are complete: ``done`` was seen
        complete and ``began`` precedes it on the same stream."""
        # No lock: a deque's append and pop are atomic, and only the communicator's caller
        # pops (the watchdog's thread only appends), so a non-empty deque stays non-empty.
        pairs = self.free.get(owner)
        return pairs.pop() if pairs else None

    def _free(self, op: Pending) -> None:
        """Keep a completed operation's events for its communicator (lock held)."""
        pairs = self.free.get(op.owner)
        if pairs is None:
            pairs = self.free[op.owner] = collections.deque()
        if len(pairs) < self.MAX_FREE_EVENTS:
            pairs.append((op.began, op.done))

    def raise_if_failed(self, owner) -> None:
        """Raise the error recorded for communicator ``owner``, if any."""
        failure = self.failures.get(owner)  # one dict read, atomic: asked before every call
        if failure is not None:
            raise failure

    def forget(self, owner) -> None:
        """Drop what is recorded or pending for communicator ``owner`` (it was closed)."""
        with self._cond:
            self.failures.pop(owner, None)
            self.free.pop(owner, None)
            self.pending = [op for op in self.pending if op.owner is not owner]

    def check(self) -> None:
        """One pass: forget completed operations; abort the communicators of expired ones."""
        to_abort = []
        with self._cond:
            now = self.clock()
            expired, kept = set(), []
            for op in self.pending:
                if op.done.query():
                    self._free(op)
                    continue
                if op.started_at is None and op.began.query():
                    op.started_at = now
                if op.started_at is not None and now - op.started_at > self.timeout_s:
                    expired.add(id(op.owner))
                    if op.owner not in self.failures:  # one abort per communicator
                        self.failures[op.owner] = RipplesTimeoutError(
                            f"NCCL {op.what} on {op.label} did not complete within "
                            f"{self.timeout_s:.1f} s of starting on this GPU (a member dead, "
                            f"or stuck before its half of it?); the communicator was aborted")
                        to_abort.append(op)
                else:
                    kept.append(op)
            self.pending = [op for op in kept if id(op.owner) not in expired]
        for op in to_abort:  # outside the lock: an abort may take a while
            op.abort()

    def close(self) -> None:
        """Stop the thread (pending operations are no longer watched)."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _run(self) -> None:
        while True:
            with self._cond:
                if self._closed:
                    return
                if not self.pending:
                    self._asleep = True
                    self._cond.wait()
                    self._asleep = False
                    continue
                # Look poll_s after work arrived, not at once: short operations finish
                # before the look, leaving nothing pending, so waking for each next one
                # took the GIL from the caller once per operation (+20 us a call).
                self._cond.wait(self.poll_s)
                if self._closed:
                    return
            self.check()
