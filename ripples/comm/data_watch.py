"""A bound on the data phase of a collective: the blocking MPI call after the members agreed.

Once the members of a collective have agreed to run it, each calls a blocking MPI
operation (``Allreduce``, ``Bcast``, ...) that cannot be interrupted. If a member dies or
freezes in between, the others would wait in it forever: the negotiation's timeouts and
liveness checks are over by then. ``DataPhaseWatch`` keeps a thread that looks at the data
phases in progress on this rank; one older than ``Config.timeout_s`` makes it ask the
members how they are (``Liveness.probe``):

- every member answers: they are alive (a huge tensor, a slow network): a warning every
  ``Config.stall_warning_s``, and the wait goes on;
- a member does not answer: it is dead or frozen, and the rank cannot leave the MPI call.
  The job is ended with ``MPI_Abort`` after a message naming the member and the
  collective. Under ``Config.fault_tolerant`` the world's communicators are revoked
  instead (``revoke``): the call fails with an error the recovery handles, and the ranks
  that still reach each other go on (``ripples.comm.membership``).
"""
from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Callable, Dict, Iterator, Optional, Sequence, Tuple

from ripples.comm import fail_fast

log = logging.getLogger("ripples")

class DataPhaseWatch:
    """Watches this rank's data phases (``phase``) against the members' liveness.

    ``probe(peers)``: the liveness question (None for a peer that did not answer);
    ``name_hosts(ranks)``: where those ranks run, as text appended to their list;
    ``enabled``: whether the peers answer such questions at all (else nothing is watched);
    ``abort``: ends the job (MPI_Abort by default), called with the message;
    ``revoke``: fault tolerant, what makes the blocked call fail instead.
    """

    def __init__(self, rank: int, timeout_s: float, stall_s: float,
                 probe: Callable[[Sequence[int]], Dict[int, object]], fault_tolerant: bool,
                 enabled: bool = True,
                 name_hosts: Callable[[Sequence[int]], str] = lambda ranks: "",
                 abort: Optional[Callable[[str], None]] = None,
                 revoke: Callable[[], None] = lambda: None):
        self.rank, self.timeout_s, self.stall_s = rank, timeout_s, stall_s
        self.enabled = enabled
        self.fault_tolerant = fault_tolerant
        self._probe = probe
        self._name_hosts = name_hosts
        self._abort = abort or fail_fast.end_job
        self._revoke = revoke
        self._phases: Dict[int, Tuple[float, Tuple[int, ...], str]] = {}
        self._lock = threading.Lock()
        self._closing = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._last_warning = 0.0

    @contextlib.contextmanager
    def phase(self, peers: Sequence[int], what: str) -> Iterator[None]:
        """The calling thread is in the data phase of ``what`` with ``peers`` (world
        ranks) for the duration of the block."""
        if not self.enabled:
            yield
            return
        ident = threading.get_ident()
        self._phases[ident] = (time.monotonic(), tuple(peers), what)
        if self._thread is None:
            self._start()
        try:
            yield
        finally:
            self._phases.pop(ident, None)

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name="ripples-data-watch",
                                                daemon=True)
                self._thread.start()

    def _watch(self) -> None:
        while not self._closing.wait(min(1.0, self.timeout_s / 4)):
            now = time.monotonic()
            for start, peers, what in list(self._phases.values()):
                if now - start >= self.timeout_s:
                    self.check(peers, what, now - start)

    def check(self, peers: Sequence[int], what: str, waited_s: float) -> None:
        """Ask ``peers`` of a data phase that has lasted ``waited_s``; end the job if one
        is gone (see the module's docstring)."""
        peers = sorted(set(peers) - {self.rank})
        silent = sorted(p for p, state in self._probe(peers).items() if state is None)
        if not silent:
            if time.monotonic() - self._last_warning >= self.stall_s:
                self._last_warning = time.monotonic()
                log.warning("%s: rank %d has been in its data phase for %.0f s; every member "
                            "answers, so it keeps waiting", what, self.rank, waited_s)
            return
        message = (f"{what}: rank(s) {silent}{self._name_hosts(silent)} did not answer a "
                   f"liveness check while rank "
                   f"{self.rank} waited {waited_s:.0f} s in the data phase (after the members "
                   "agreed): they have died or are frozen")
        if self.fault_tolerant:
            log.warning("%s; fault tolerant: the world's communicators are revoked, and the "
                        "ranks that reach each other go on", message)
            self._revoke()
            return
        self._closing.set()
        self._abort(f"{message}; a blocking MPI call cannot be left, so the job is ended "
                    "(MPI_Abort)")

    def close(self) -> None:
        """Stop the watching thread."""
        self._closing.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()

