"""Slow is not dead: tell a peer that is alive but busy from one that is dead or hung.

A wait on peers that reaches ``Config.timeout_s`` does not fail at once. The waiter asks the
peers it waits for how they are (``Liveness.keep_waiting``), and every rank answers from a
small responder thread on a private communicator, whatever its main thread is doing:

- a peer that does not answer within a short bound (``answer_wait_s``) is dead (or its
  process is frozen): the wait fails, naming it; unless its process is seen running
  (``ripples.core.processes``; a peer of another host is looked at by another rank of its
  host, asked to): its responder then waits for the interpreter lock (a long import or
  native call) or for a core, and it is asked again for as long as it runs, up to
  ``Config.stall_shutdown_s``;
- a peer that is outside ripples (computing, evaluating, writing a checkpoint) is busy: the
  wait goes on, with a stall warning every ``Config.stall_warning_s`` naming where each
  busy peer is;
- ... unless its main thread has not moved for ``Config.stall_shutdown_s``
  (``ripples.comm.stack_watch``: the same Python stack, e.g. blocked in an MPI barrier that
  this rank will never reach): it is stuck, not slow, and the wait fails, naming it and
  where it is;
- a peer that is itself waiting inside ripples is fine while its own wait is young or was
  recently found to be on a busy peer ("justified"): chains of waits ending at a busy rank
  go on. Peers that have all waited inside ripples for longer than the timeout with no busy
  rank at the end of the chain wait on each other (a collective one of them will never
  call, or calls in another order): the wait fails, naming them.

So a slow rank never fails its peers, a stuck one is named after ``stall_shutdown_s``, a dead one is named within the timeout plus the
answer bound, and a deadlock inside ripples is named within about twice the timeout.
``Config.wait_for_busy_peers=False`` keeps the strict rule: a peer that has not arrived
within the timeout fails the wait, even when it is alive.

Each rank records when its caller started waiting inside ripples (``enter``/``leave``),
which is all the responder reports; the decision is the pure function ``assess``. A rank
that just gave up on peers waiting on each other reports itself hung for a while longer, so
that the rest of the cycle, asking a moment later, does not take it for a busy rank; only
to peers whose wait began before it gave up (a question carries how long the asker has
waited), so that a later, unrelated wait on it while it computes still finds it busy.
"""
from __future__ import annotations

import logging
import math
import re
import threading
import time
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from mpi4py import MPI

from ripples.comm import outbox
from ripples.comm.stack_watch import MainThreadWatch
from ripples.core.errors import PeersSilentError, RipplesTimeoutError
from ripples.core.processes import (ProcessId, Sample, condition, has_run, sample,
                                   this_process)

log = logging.getLogger("ripples")

# Every tag used on the liveness communicator, here so that none is used twice.
_PING, _PONG = 41, 42
MEMBERSHIP_TAGS = (43, 44)  # the membership rounds' (ripples.comm.membership)
_LOOK, _LOOKED = 45, 46  # asked of a rank on a silent peer's host: how its process runs
_WITNESSES = 2  # ranks asked to look at one silent peer
_RESPONDER_NAP_S = 0.02
_NAPS_PER_RELEASE = 50  # about a second between looks at the outbox
OUTSIDE = -1.0  # PeerState.inside_s of a peer that is not waiting inside ripples
NEVER = -1.0    # PeerState.justified_s of a peer whose wait was never found justified


class PeerState(NamedTuple):
    """What a peer answered: how long it has waited inside ripples (``OUTSIDE``: it is not
    waiting), how long ago its wait was last found to be on a busy peer (``NEVER``), how
    long its main thread's stack has been still and where that thread is."""

    inside_s: float
    justified_s: float
    still_s: float = 0.0
    where: str = ""


class Verdict(NamedTuple):
    wait: bool             # the wait goes on
    justified: bool        # ... because some peer is busy, or its own wait is justified
    dead: List[int]        # peers that did not answer
    hung: List[int]        # peers waiting inside ripples, unjustified, for too long
    busy: List[int]        # peers outside ripples
    stuck: List[int] = []  # busy peers whose main thread has not moved for too long


def grace_s(timeout_s: float) -> float:
    """How much longer than the timeout a peer's unjustified wait may last before it counts
    as hung: a peer checks its own wait only once the timeout has passed."""
    return max(1.0, 0.5 * timeout_s)


def answer_wait_s(timeout_s: float) -> float:
    """How long a waiter waits for a peer's answer before calling it dead. The responder
    answers within tens of milliseconds even on an oversubscribed machine."""
    return min(5.0, max(1.0, 0.2 * timeout_s))


def assess(states: Dict[int, Optional[PeerState]], timeout_s: float,
           stall_shutdown_s: float = 0.0) -> Verdict:
    """Whether a wait on the peers in ``states`` (None: no answer) should go on.

    ``stall_shutdown_s`` > 0: a busy peer whose main thread has been still that long is
    stuck and fails the wait."""
    dead = sorted(r for r, s in states.items() if s is None)
    if dead:
        return Verdict(False, False, dead, [], [])
    limit = timeout_s + grace_s(timeout_s)
    busy = sorted(r for r, s in states.items() if s.inside_s == OUTSIDE)
    stuck = [r for r in busy if stall_shutdown_s and states[r].still_s >= stall_shutdown_s]
    if stuck:
        return Verdict(False, False, [], [], busy, stuck)
    justified = [r for r, s in states.items()
                 if s.inside_s != OUTSIDE and s.justified_s != NEVER and s.justified_s <= limit]
    if busy or justified:
        return Verdict(True, True, [], [], busy)
    if any(s.inside_s < limit for s in states.values()):
        return Verdict(True, False, [], [], [])  # not known yet: they check their own waits
    return Verdict(False, False, [], sorted(states), [])


def busy_report(states: Dict[int, Optional[PeerState]], ranks: Sequence[int]) -> str:
    """One clause per rank: where its main thread is and how long it has been still."""
    return "; ".join(f"rank {r} at {states[r].where} (still for {states[r].still_s:.0f} s)"
                     for r in ranks)


class Liveness:
    """This rank's responder and its side of the question (``keep_waiting``).

    ``comm``: a private duplicate of the runtime's world (this object frees it).
    """

    def __init__(self, comm: MPI.Comm, timeout_s: float, stall_s: float, enabled: bool,
                 stall_shutdown_s: float = 0.0):
        self._comm = comm
        self._comm.Set_errhandler(MPI.ERRORS_RETURN)
        self.rank = comm.Get_rank()
        self.timeout_s, self.stall_s, self.enabled = timeout_s, stall_s, enabled
        self.stall_shutdown_s = stall_shutdown_s
        self._main_thread = MainThreadWatch()
        # Each rank's process: its host names where silent peers run, and a peer of this
        # host can be seen running while it is silent (collective over ``comm``).
        self.processes: List[ProcessId] = [ProcessId(*p) for p in comm.allgather(
            tuple(this_process()))]
        self._depth = 0
        self._inside_since = 0.0
        self._justified_at: Optional[float] = None
        self._last_warning = 0.0
        self._last_kept = -math.inf  # when keep_waiting last let a wait go on
        self._hung_until = -math.inf  # reports a hung wait until then, though it left it,
        self._gave_up_at = -math.inf   # ... to askers whose wait began before this
        self._sequence = 0
        self._looks_asked = 0
        self._probe_lock = threading.Lock()
        self._closing = threading.Event()
        self._thread = None
        if enabled and comm.Get_size() > 1:
            self._thread = threading.Thread(target=self._respond, name="ripples-liveness",
                                            daemon=True)
            self._thread.start()

    # ------------------------------------------------------------------ this rank's state

    def enter(self) -> None:
        """The caller starts waiting inside ripples (nested calls count once)."""
        if self._depth == 0:
            self._inside_since = time.monotonic()
            self._justified_at = None
        self._depth += 1

    def leave(self) -> None:
        self._depth = max(0, self._depth - 1)

    def waited_s(self) -> float:
        """How long the caller has waited inside ripples (0 when it is not waiting)."""
        return time.monotonic() - self._inside_since if self._depth else 0.0

    def state(self, asker_waited_s: float = math.inf) -> PeerState:
        """This rank's answer to a peer that has waited ``asker_waited_s``."""
        now = time.monotonic()
        if self._depth == 0:
            # It just gave up on peers waiting on each other: hung to the rest of that cycle.
            if now < self._hung_until and now - asker_waited_s <= self._gave_up_at:
                return PeerState(math.inf, NEVER)
            return PeerState(OUTSIDE, NEVER, self._main_thread.still_s(),
                             self._main_thread.where())
        justified = self._justified_at
        return PeerState(now - self._inside_since, NEVER if justified is None else now - justified)

    def check_after_s(self) -> float:
        """How long a wait runs before it asks its peers: early enough that a dead peer is
        named within the timeout, answer bound included."""
        if not self.enabled:
            return self.timeout_s
        margin = 0.1 * self.timeout_s  # for the round trip before the question is asked
        return max(0.5 * self.timeout_s, self.timeout_s - answer_wait_s(self.timeout_s) - margin)

    def stall_s_now(self) -> float:
        """The stall warning bound for a new wait: none while a wait goes on because its
        peers are alive (``keep_waiting`` warns for it), else ``stall_s``."""
        if time.monotonic() - self._last_kept < self.timeout_s + grace_s(self.timeout_s):
            return math.inf
        return self.stall_s

    # ------------------------------------------------------------------ asking the peers

    def keep_waiting(self, peers: Sequence[int], error: RipplesTimeoutError) -> None:
        """Return when the wait that raised ``error`` should go on (every peer in ``peers``,
        world ranks, answered and some is busy, or the question is still open); otherwise
        raise ``error``, extended by what was found. Logs a stall warning now and then."""
        peers = sorted(set(peers) - {self.rank})
        if not self.enabled or not peers or self._thread is None:
            raise error
        states = self.probe(peers)
        verdict = assess(states, self.timeout_s, self.stall_shutdown_s)
        if verdict.wait:
            self._last_kept = time.monotonic()
            if verdict.justified:
                self._justified_at = time.monotonic()
            self._warn(error, verdict, states)
            return
        if verdict.stuck:
            found = (f"{busy_report(states, verdict.stuck)}: not moved for "
                     f"Config.stall_shutdown_s={self.stall_shutdown_s:g} s, so it is stuck, "
                     "not slow (blocked in a call that waits for this rank?); "
                     "RIPPLES_STALL_SHUTDOWN_S=0 waits for it however long")
        elif verdict.dead:
            found = (f"rank(s) {verdict.dead}{self.on_hosts(verdict.dead)} did not answer "
                     "a liveness check within "
                     f"{answer_wait_s(self.timeout_s):g} s: they have likely died, or shut "
                     "ripples down")
        else:
            # Peers of the same cycle may ask a moment later: this rank is not busy for
            # them, only gone from a wait that could not end.
            self._gave_up_at = time.monotonic()
            self._hung_until = self._gave_up_at + self.timeout_s + grace_s(self.timeout_s)
            found = (f"rank(s) {verdict.hung} have themselves waited inside ripples for over "
                     f"{self.timeout_s + grace_s(self.timeout_s):g} s with no busy rank to "
                     "wait for: the members are waiting on each other (a collective some "
                     "member never calls, or calls in another order)")
        if verdict.dead:
            failure = PeersSilentError(f"{error}; {found}", missing=error.missing,
                                       silent=verdict.dead)
        else:
            failure = RipplesTimeoutError(f"{error}; {found}", missing=error.missing)
        failure.finding = found
        raise failure from error

    def probe(self, peers: Sequence[int]) -> Dict[int, Optional[PeerState]]:
        """Ask ``peers`` how they are; None for those that did not answer in time."""
        with self._probe_lock:
            self._sequence += 1
            sequence = self._sequence
            answers: Dict[int, Optional[PeerState]] = {}
            self._ask(peers, sequence, answers)
            waiting = [p for p in peers if p not in answers]
            wait_s = answer_wait_s(self.timeout_s)
            earlier: Dict[int, Optional[Sample]] = {p: sample(self.processes[p])
                                                    for p in waiting if self._here(p)}
            asked = self._ask_witnesses(waiting)
            self._collect(waiting, sequence, answers, wait_s)
            # A silent peer that runs holds the interpreter lock in a long call (an import,
            # a native kernel) or waits for a core: slow, not dead. It is asked for as long
            # as it keeps running, up to the stuck bound. A peer of this host is looked at
            # here; one of another host by a rank of its host (the first look only says it
            # can run, so it gets one more round to show it runs).
            give_up = time.monotonic() + (self.stall_shutdown_s or math.inf)
            while waiting and time.monotonic() < give_up:
                now = self._looks(waiting, asked, wait_s)
                running = [p for p in waiting if has_run(earlier.get(p), now[p])
                           or (p not in earlier and now[p] is not None)]
                if not running:
                    break
                self._justified_at = time.monotonic()  # to those asking this rank meanwhile
                waiting[:] = running
                earlier = {p: now[p] for p in running}
                self._ask(waiting, sequence, answers)  # in case a question went unanswered
                waiting[:] = [p for p in waiting if p not in answers]
                asked = self._ask_witnesses(waiting)
                self._collect(waiting, sequence, answers, wait_s)
            answers.update({peer: None for peer in waiting})
            return answers

    def _ask(self, peers: Sequence[int], sequence: int,
             answers: Dict[int, Optional[PeerState]]) -> None:
        """Send question ``sequence`` to ``peers``; None into ``answers`` for a peer that
        cannot be sent to (dead)."""
        question = (sequence, self.waited_s())
        for peer in peers:
            try:
                outbox.keep_until_complete(self._comm.isend(question, dest=peer, tag=_PING))
            except MPI.Exception:
                answers[peer] = None

    def _here(self, peer: int) -> bool:
        return self.processes[peer].host == self.processes[self.rank].host

    def _ask_witnesses(self, peers: Sequence[int]) -> Dict[int, Tuple[int, List[int]]]:
        """Ask up to ``_WITNESSES`` other ranks of each peer's host (for peers of other
        hosts) to look at the peer's process; their answers are read by ``_looks``.
        Returns peer -> (question number, witnesses asked)."""
        asked = {}
        for peer in peers:
            if self._here(peer):
                continue
            witnesses = [w for w, p in enumerate(self.processes) if w not in (peer, self.rank)
                         and p.host == self.processes[peer].host][:_WITNESSES]
            self._looks_asked += 1
            for witness in witnesses:
                try:
                    outbox.keep_until_complete(self._comm.isend(
                        (self._looks_asked, peer), dest=witness, tag=_LOOK))
                except MPI.Exception:
                    pass  # a dead witness: the others may still answer
            asked[peer] = (self._looks_asked, witnesses)
        return asked

    def _looks(self, peers: Sequence[int], asked: Dict[int, Tuple[int, List[int]]],
               wait_s: float) -> Dict[int, Optional[Sample]]:
        """A look at each peer's process: read here for a peer of this host, else the
        first look a witness answered (None where none answered, or the process cannot
        run). A witness's answer may come after the answer bound when it, or this rank,
        waits for a core: the witnesses get ``wait_s`` more to answer."""
        looks = {peer: sample(self.processes[peer]) for peer in peers if peer not in asked}
        pending = {peer: asked[peer] for peer in peers if peer in asked}

        def heard_all() -> bool:
            for peer, (number, witnesses) in list(pending.items()):
                answered, seen = self._witness_answer(number, witnesses)
                if answered:
                    looks[peer] = seen
                    del pending[peer]
            return not pending

        _poll(heard_all, wait_s)
        looks.update({peer: None for peer in pending})
        return looks

    def _witness_answer(self, number: int, witnesses: Sequence[int]
                        ) -> Tuple[bool, Optional[Sample]]:
        """(True, the look) once a witness answered look ``number`` (older answers are
        dropped); (True, None) when there is no witness to hear from."""
        if not witnesses:
            return True, None
        for witness in witnesses:
            try:
                while self._comm.iprobe(source=witness, tag=_LOOKED):
                    answer = _decoded(self._comm, witness, _LOOKED, _as_look)
                    if answer is not None and answer[0] == number:
                        return True, answer[1]
            except MPI.Exception:  # the witness died: it says nothing
                continue
        return False, None

    def _collect(self, waiting: List[int], sequence: int,
                 answers: Dict[int, Optional[PeerState]], wait_s: float) -> None:
        """Take the answers to question ``sequence`` that come within ``wait_s`` into
        ``answers`` (None for a peer that died meanwhile), removing their senders from
        ``waiting``."""
        def heard_all() -> bool:
            for peer in list(waiting):
                try:
                    state = self._answer(peer, sequence)
                except MPI.Exception:  # it died (fault tolerant: MPI says so)
                    answers[peer] = None
                    waiting.remove(peer)
                    continue
                if state is not None:
                    answers[peer] = state
                    waiting.remove(peer)
            return not waiting

        _poll(heard_all, wait_s)

    def _answer(self, peer: int, sequence: int) -> Optional[PeerState]:
        """``peer``'s answer to question ``sequence`` if it has come (older answers are
        dropped)."""
        while self._comm.iprobe(source=peer, tag=_PONG):
            answer = _decoded(self._comm, peer, _PONG, _as_answer)
            if answer is not None and answer[0] == sequence:
                return answer[1]
        return None

    def _warn(self, error: RipplesTimeoutError, verdict: Verdict,
              states: Dict[int, Optional[PeerState]]) -> None:
        now = time.monotonic()
        if now - self._last_warning < self.stall_s:
            return
        self._last_warning = now
        who = (f"alive and busy outside ripples: {busy_report(states, verdict.busy)}"
               if verdict.busy else "the peers are alive and waiting on others")
        log.warning("%s; %s, so rank %d keeps waiting (a slow rank is not a dead one; "
                    "Config.wait_for_busy_peers=False fails instead)", _still_waiting(error),
                    who, self.rank)

    # ------------------------------------------------------------------ the responder

    def _respond(self) -> None:
        status = MPI.Status()
        naps = 0
        while not self._closing.is_set():
            try:
                self._main_thread.sample()
                if self._comm.iprobe(source=MPI.ANY_SOURCE, tag=_PING, status=status):
                    source = status.Get_source()
                    question = _decoded(self._comm, source, _PING, _as_question)
                    if question is not None:
                        sequence, asker_waited_s = question
                        outbox.keep_until_complete(self._comm.isend(
                            (sequence, tuple(self.state(asker_waited_s))), dest=source,
                            tag=_PONG))
                elif self._comm.iprobe(source=MPI.ANY_SOURCE, tag=_LOOK, status=status):
                    source = status.Get_source()
                    question = _decoded(self._comm, source, _LOOK, _as_look_question)
                    if question is not None:
                        number, peer = question
                        seen = sample(self.processes[peer])
                        outbox.keep_until_complete(self._comm.isend(
                            (number, None if seen is None else tuple(seen)), dest=source,
                            tag=_LOOKED))
                else:
                    self._closing.wait(_RESPONDER_NAP_S)
                    naps += 1
                    if naps % _NAPS_PER_RELEASE == 0:
                        outbox.release_completed()  # what ended: buffers no one else frees
            except MPI.Exception:  # a peer died mid-message: the others still get answers
                self._closing.wait(_RESPONDER_NAP_S)
            except Exception as error:  # a rank whose responder stopped would look dead
                log.warning("ripples liveness: dropped a question it could not answer: %s",
                            error)

    def on_hosts(self, ranks: Sequence[int]) -> str:
        """`` (on h2, h3)``: the hosts of world ``ranks``, to name a lost host; for a rank
        of this host, also what its process is doing (`` (on h1: rank 2's process is
        stopped by SIGSTOP or a tracer)``)."""
        hosts = ", ".join(sorted({self.processes[r].host for r in ranks}))
        seen = [(r, condition(self.processes[r])) for r in ranks]
        told = "; ".join(f"rank {r}'s process is {how}" for r, how in seen if how)
        return f" (on {hosts}: {told})" if told else f" (on {hosts})"

    @property
    def answering(self) -> bool:
        """Whether this rank's responder runs (and so the peers' do: same settings)."""
        return self._thread is not None

    @property
    def comm(self) -> MPI.Comm:
        """The private communicator the checks travel on."""
        return self._comm

    def abandon(self) -> None:
        """Stop the responder without freeing the communicator (revoked after a death)."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join()

    def close(self) -> None:
        """Stop the responder and free the communicator."""
        self._closing.set()
        if self._thread is not None:
            self._thread.join()
        self._comm.Free()


def _poll(done: Callable[[], bool], wait_s: float) -> None:
    """Call ``done`` until it returns True or ``wait_s`` have passed, with pauses that
    grow from 0.1 ms to 10 ms between calls."""
    end = time.monotonic() + wait_s
    pause = 1e-4
    while not done() and time.monotonic() < end:
        time.sleep(pause)
        pause = min(0.01, pause * 2)


def _as_question(message) -> Tuple[int, float]:
    sequence, asker_waited_s = message
    return int(sequence), float(asker_waited_s)


def _as_look_question(message) -> Tuple[int, int]:
    number, peer = message
    return int(number), int(peer)


def _as_look(message) -> Tuple[int, Optional[Sample]]:
    number, seen = message
    return int(number), None if seen is None else Sample(int(seen[0]), bool(seen[1]))


def _as_answer(message) -> Tuple[int, PeerState]:
    echo, state = message
    return int(echo), PeerState(*state)


def _decoded(comm: MPI.Comm, source: int, tag: int, parse):
    """The next message from ``source`` on ``tag``, unpickled and read by ``parse``; None
    (logged) if it is not a valid message. The responder must outlive one bad message: a
    rank whose responder stopped would be taken for a dead one."""
    try:
        return parse(comm.recv(source=source, tag=tag))
    except MPI.Exception:
        raise
    except Exception as error:  # unpickling garbage raises anything
        log.warning("ripples liveness: dropped an unreadable message from rank %d (tag %d): "
                    "%s", source, tag, error)
        return None


_GAVE_UP = re.compile(r"gave up after ([0-9.e+-]+) s \(Config\.timeout_s / RIPPLES_TIMEOUT_S\)")


def _still_waiting(error: RipplesTimeoutError) -> str:
    """The text of the timeout that a stall warning reports, for a wait that goes on: it
    did not give up, and the seconds are those waited so far (a liveness check comes a
    little before ``Config.timeout_s``)."""
    return _GAVE_UP.sub(r"not done after \1 s", str(error))
