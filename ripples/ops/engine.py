"""The communication engine: every collective of a rank runs here, matched by name.

A collective is submitted as one or more named requests (a grouped call gives one request
per tensor, sharing a ``Handle``). Requests wait in submission order. A control round on a
group (``ripples.comm.control.negotiate``) tells which of them every member has submitted;
those run at once, in the leader's order, consecutive all-reduces of one kind fused into
few buffers. Asynchronous collectives progress on a background thread, so ``poll`` is a
local check and communication overlaps with whatever the caller does next; a caller that
waits (``synchronize`` or a blocking collective) runs the rounds itself when the thread is
idle, so a blocking collective costs no thread hand-off.

Groups are served oldest request first, on every rank, so collectives on different groups
must still be issued in one consistent order across ranks (as with MPI); within a group,
names may come in any order.
"""
from __future__ import annotations

import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import torch
from mpi4py import MPI

from ripples.comm.control import Decision, Record, missing_description, negotiate
from ripples.comm.mpi import Deadline
from ripples.core.errors import RipplesError, RipplesTimeoutError
from ripples.ops.handles import Handle
from ripples.ops.ring_allreduce import PeerRing

Pair = Tuple[torch.Tensor, torch.Tensor]


class Request:
    """One named collective on one group.

    An all-reduce carries ``pair`` and a ``wire`` text starting with ``"allreduce|"`` and is
    fused with its neighbours of equal ``fuse_key``; anything else carries ``run(comm,
    active)``, which does the data movement once the members agreed.
    """

    __slots__ = ("name", "group", "what", "signature", "wire", "handle", "pair", "reduce",
                 "run", "fuse_key", "nbytes", "submitted", "missing")

    def __init__(self, name: str, group, what: str, signature: str, handle: Handle,
                 wire: str = "", pair: Optional[Pair] = None, reduce=None,
                 run: Optional[Callable] = None):
        self.name, self.group, self.what = name, tuple(group), what
        self.signature, self.wire, self.handle = signature, wire, handle
        self.pair, self.reduce, self.run = pair, reduce, run
        self.fuse_key = wire.split("|", 2)[1] if pair is not None else None
        self.nbytes = pair[0].numel() * pair[0].element_size() if pair is not None else 0
        self.submitted = time.monotonic()
        self.missing: Optional[List[int]] = None


class Engine:
    """Pending requests of one rank and the thread that progresses them."""

    def __init__(self, runtime, reduce_fused: Callable, participate: Dict[str, Callable]):
        self._rt = runtime
        self._reduce_fused = reduce_fused  # (comm, group, active, requests) for one fused chunk
        self._participate = participate    # kind -> (comm, wires) for a joined rank
        self._lock = threading.Lock()      # guards the pending list and names
        self._wake = threading.Condition(self._lock)
        self._comm_lock = threading.Lock()  # whoever holds it talks to the other ranks
        self._pending: List[Request] = []
        self._names: Dict[tuple, Request] = {}
        self._unnamed: Dict[tuple, int] = {}
        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._join_rounds = -1
        self._here = threading.local()
        self._waited_here = _WaitedHere(self._here)

    # ------------------------------------------------------------------ submission

    def auto_name(self, group, what: str) -> str:
        """The name of an unnamed collective: counted per group, so members that issue
        unnamed collectives in the same order agree without talking."""
        group = tuple(group)
        with self._lock:
            n = self._unnamed.get(group, 0)
            self._unnamed[group] = n + 1
        return f"{what}.noname.{n}"

    def submit(self, requests: Sequence[Request]) -> None:
        """Queue ``requests`` (all or none); a name already in flight on the group raises."""
        with self._lock:
            seen = set()
            for request in requests:
                key = (request.group, request.name)
                if key in self._names or key in seen:
                    raise ValueError(
                        f"a collective named {request.name!r} is already in flight on group "
                        f"{request.group} (rank {self._rt.rank}); give concurrent collectives "
                        "distinct names, or synchronize the first before reusing its name")
                seen.add(key)
            for request in requests:
                self._names[(request.group, request.name)] = request
                self._pending.append(request)
                request.handle.generation = self._rt.generation
            if getattr(self._here, "waiting", False):
                return  # the caller waits at once and runs the round itself
            self._wake.notify()
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name="ripples-engine",
                                                daemon=True)
                self._thread.start()

    def waited_here(self) -> "_WaitedHere":
        """A context: submissions in its block are waited for at once by the submitting
        thread (a blocking collective), so the engine thread is not woken for them."""
        return self._waited_here

    def wait(self, handle: Handle) -> None:
        """Block until ``handle`` is done, running control rounds here when nobody else is."""
        handle.blocking = True
        pause = 0.0
        liveness = self._rt.liveness  # peers that wait on this rank may ask about it
        liveness.enter()
        try:
            while not handle.done:
                if self._comm_lock.acquire(blocking=False):
                    try:
                        progressed = handle.done or self._step_here()
                    finally:
                        self._comm_lock.release()
                    if progressed:
                        pause = 0.0
                        continue
                    pause = min(_MAX_PAUSE_S, pause * 2 or _MIN_PAUSE_S)
                    handle.wait(pause)
                else:
                    handle.wait(_MAX_PAUSE_S)
        finally:
            liveness.leave()

    def run(self, requests: Sequence[Request], handle: Handle):
        """Submit and wait: the blocking form of a collective. Raises its error."""
        self.submit(requests)
        try:
            self.wait(handle)
        except Exception as exc:
            raise self._rt.raised(exc, handle.generation) from exc
        if handle.error is not None:
            raise self._rt.raised(handle.error, handle.generation) from handle.error
        return handle.result

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def drain(self) -> None:
        """Wait until every submitted request has finished (failures stay in their handles)."""
        while True:
            with self._lock:
                if not self._pending:
                    return
                handle = self._pending[0].handle
            self.wait(handle)

    def discard_group(self, group) -> None:
        """Free ``group``'s cached communicator here (members rebuild it if it is used again)."""
        with self._comm_lock:
            self._rt.cache.discard(tuple(group))

    # ------------------------------------------------------------------ progress

    def _serve(self) -> None:
        torch.set_grad_enabled(False)  # for this thread: collectives never record history
        pause = 0.0
        cycle_s = self._rt.config.cycle_time_ms / 1000.0
        while True:
            with self._wake:
                idle = not self._pending
                while not self._pending and not self._closing:
                    self._wake.wait()
                if not self._pending:
                    return
            if idle and cycle_s:  # let a burst of submissions gather into one round
                time.sleep(cycle_s)
            with self._comm_lock:
                try:
                    progressed = self._step()
                except Exception as exc:  # e.g. a communicator revoked after a death
                    self._fail_pending(exc)
                    continue
            if progressed:
                pause = 0.0
            else:  # peers have not submitted yet: back off instead of spinning rounds
                pause = min(_MAX_PAUSE_S, pause * 2 or _MIN_PAUSE_S)
                time.sleep(pause)

    def _step_here(self) -> bool:
        """``_step`` on a caller's thread, whose grad mode may be on (it is per thread)."""
        if not torch.is_grad_enabled():
            return self._step()
        with torch.no_grad():
            return self._step()

    def _step(self) -> bool:
        """One control round on the group of the oldest request, and the agreed data
        movement. Returns whether anything finished. Caller holds the comm lock."""
        rt = self._rt
        with self._lock:
            if not self._pending:
                return False
            pending = self._pending
            group = pending[0].group
            batch = pending[:1] if len(pending) == 1 else [r for r in pending if r.group == group]
        if rt.timeline.enabled:
            rt.timeline.mark_cycle()
        comm = rt.world if group == rt.world_group else rt.cache.lookup(group)
        if len(group) == 1:
            self._execute(comm, group, 1, batch)
            return True
        ring = self._ring(group)
        # Over the ring, only what the ring cannot carry needs the group's communicator.
        need_create = comm is None and (ring is None or any(_needs_communicator(r)
                                                            for r in batch))
        record = Record(group, need_create, -1, any(r.handle.blocking for r in batch),
                        [(r.name, r.signature, r.wire) for r in batch])
        what = batch[0].what
        start = rt.timeline.now() if rt.timeline.enabled else 0.0
        try:
            decision = negotiate(rt.ctl, record, what, rt.liveness.check_after_s(),
                                 rt.liveness.stall_s_now())
        except RipplesTimeoutError as exc:
            try:  # members that are alive and busy are waited for: a later round
                rt.liveness.keep_waiting(exc.missing, exc)
            except RipplesTimeoutError as final:
                self._fail_unmatched(batch, final)
                return True
            now = time.monotonic()
            for request in batch:
                request.submitted = now
            return False
        except RipplesError as exc:
            self._fail_unmatched(batch, exc)
            return True
        if rt.timeline.enabled:  # the control round is where a rank waits for its peers
            rt.timeline.complete("wait", "wait", start, rt.timeline.now() - start,
                                 {"group": list(group), "for": what,
                                  "names": len(decision.run)})
        if decision.create:
            comm = rt.cache.create(group)
        by_name = {r.name: r for r in batch}
        for name, error in decision.failed.items():
            self._fail_unmatched([by_name[name]], error)
        self._execute(comm, group, decision.active, [by_name[n] for n in decision.run], ring)
        progressed = bool(decision.run or decision.failed)
        if not progressed:
            self._expire(batch, decision)
        return progressed

    def _expire(self, batch: List[Request], decision: Decision) -> None:
        """Fail requests that other members have not matched within the timeout."""
        now = time.monotonic()
        timeout = self._rt.config.timeout_s
        # One liveness question per set of missing members (a dead one takes seconds to tell).
        found: Dict[tuple, Optional[RipplesTimeoutError]] = {}
        for request in batch:
            request.missing = decision.missing.get(request.name, request.missing)
            if now - request.submitted <= timeout:
                continue
            error = RipplesTimeoutError(
                f"{request.what} {request.name!r} on group {request.group}: "
                f"{missing_description(request.missing)} within {timeout:g} s "
                f"(rank {self._rt.rank} is waiting; Config.timeout_s / RIPPLES_TIMEOUT_S)",
                missing=request.missing or ())
            if error.missing not in found:
                try:  # members busy outside ripples may still call it
                    self._rt.liveness.keep_waiting(error.missing, error)
                    found[error.missing] = None
                except RipplesTimeoutError as final:
                    found[error.missing] = final
            failure = found[error.missing]
            if failure is None:
                request.submitted = time.monotonic()
            elif failure.finding:  # this request's own message, with what the check found
                self._fail_unmatched([request], RipplesTimeoutError(
                    f"{error}; {failure.finding}", missing=error.missing))
            else:
                self._fail_unmatched([request], error)

    def _ring(self, group) -> Optional[PeerRing]:
        """The point-to-point ring of ``group``, when groups all-reduce that way
        (``Config.group_allreduce``); None for the world and for per-group communicators."""
        rt = self._rt
        if group == rt.world_group or not rt.config.ring_groups:
            return None
        config = rt.config
        return PeerRing(rt.peers, group, rt.rank,
                        lambda describe, missing: Deadline(
                            config.timeout_s, config.stall_warning_s, describe,
                            lambda: missing, rt.liveness))

    def _execute(self, comm, group, active: int, requests: List[Request],
                 ring: Optional[PeerRing] = None) -> None:
        """Run agreed ``requests``: fused all-reduces over ``ring`` when given (host tensors),
        everything else over ``comm``."""
        def reduce(members: List[Request]) -> None:
            carrier = comm if ring is None or _needs_communicator(members[0]) else ring
            self._reduce_fused(carrier, group, active, members)

        if len(requests) == 1 and requests[0].pair is not None:  # nothing to fuse with
            self._perform(requests, group, lambda: reduce(requests))
            return
        threshold = max(1, self._rt.config.fusion_threshold_bytes)
        i = 0
        while i < len(requests):
            first = requests[i]
            if first.pair is None:
                self._perform([first], group, lambda: first.run(comm, active))
                i += 1
                continue
            j = i
            while j < len(requests) and requests[j].fuse_key == first.fuse_key:
                j += 1
            for chunk in fusion_chunks([r.nbytes for r in requests[i:j]], threshold):
                members = [requests[i + k] for k in chunk]
                self._perform(members, group, lambda m=members: reduce(m))
            i = j

    def _perform(self, requests: List[Request], group, action: Callable[[], None]) -> None:
        """Run the agreed data movement of ``requests``, record it on the timeline under
        their names, and finish their handles (an error is kept for synchronize)."""
        timeline = self._rt.timeline
        start = timeline.now() if timeline.enabled else 0.0
        error = None
        try:
            with self._rt.data_watch.phase(group, f"{requests[0].what} {requests[0].name!r}"):
                action()
        except BaseException as exc:
            error = exc
        if timeline.enabled:
            timeline.complete(requests[0].what, "communication", start, timeline.now() - start,
                              {"group": list(group), "names": [r.name for r in requests],
                               "bytes": sum(r.nbytes for r in requests)})
        self._finish(requests, error)

    def _fail_unmatched(self, requests: Sequence[Request], error: BaseException) -> None:
        """Fail requests whose collective never ran. An unnamed one gives its number back
        (when it is the group's latest), so this rank counts on as the members that never
        issued it do, and the group's next unnamed collective still matches."""
        with self._lock:
            for request in reversed(requests):
                n = self._unnamed.get(request.group, 0)
                if n > 0 and request.name.endswith(f".noname.{n - 1}"):
                    self._unnamed[request.group] = n - 1
        self._finish(requests, error)

    def _fail_pending(self, error: BaseException) -> None:
        """Fail every pending request: the control round itself failed, so none can run."""
        with self._lock:
            pending = list(self._pending)
        self._finish(pending, error)

    def _finish(self, requests: Sequence[Request], error: Optional[BaseException]) -> None:
        with self._lock:
            for request in requests:
                if self._names.pop((request.group, request.name), None) is not None:
                    self._pending.remove(request)
        for request in requests:
            request.handle.part_done(error)

    # ------------------------------------------------------------------ join

    def join(self) -> int:
        """Horovod's ``join()`` on this rank: finish what is pending, then take part in the
        other ranks' all-reduces, all-gathers and broadcasts (neutral contributions) until
        every rank has joined. Returns the rank that joined last. Unnamed collectives are
        counted afresh afterwards, so uneven work before the join leaves no trace."""
        rt = self._rt
        self.drain()
        if rt.size == 1:
            return rt.rank
        reducers = [r for r in list(rt.reducers) if rt.rank in r.group]
        for reducer in reducers:  # planned all-reduces of the active ranks get our zeros
            reducer.join_poll()

        steps_seen = 0

        def idle() -> bool:
            nonlocal steps_seen
            ran = sum(reducer.join_poll() for reducer in reducers)
            steps_seen += ran
            return ran > 0

        rt.liveness.enter()
        try:
            return self._join_until_all(reducers, idle, lambda: steps_seen)
        finally:
            rt.liveness.leave()

    def _join_until_all(self, reducers, idle, steps_seen) -> int:
        """The join rounds, until every rank has joined; returns the last to join."""
        rt = self._rt
        rounds = 0
        while True:
            with self._comm_lock:
                record = Record(rt.world_group, False, rounds, False, [])
                try:
                    decision = negotiate(rt.ctl, record, "join", rt.liveness.check_after_s(),
                                         rt.liveness.stall_s_now(), idle)
                except RipplesTimeoutError as exc:  # ranks still training are waited for
                    rt.liveness.keep_waiting(exc.missing, exc)
                    continue
                if decision.last_joined >= 0:
                    for reducer in reducers:
                        reducer.join_finish()
                    # Planned steps ran outside these rounds: a rank that took part in
                    # neither joined before someone else stopped training.
                    fresh = rounds == 0 and steps_seen() == 0
                    last = rt.ctl.allreduce(rt.rank if fresh else -1, op=MPI.MAX)
                    if last >= 0:
                        decision.last_joined = last
                    # Ranks that joined early ran fewer unnamed collectives; every rank is
                    # at this point together, so counting starts afresh everywhere.
                    with self._lock:
                        self._unnamed.clear()
                    return decision.last_joined
                self._take_part(decision.run)
            rounds += 1

    def _take_part(self, wires: List[Tuple[str, str]]) -> None:
        """A joined rank's side of the collectives the active ranks agreed on."""
        with self._rt.data_watch.phase(self._rt.world_group, "a collective (as a joined rank)"):
            self._contribute(wires)

    def _contribute(self, wires: List[Tuple[str, str]]) -> None:
        comm = self._rt.world
        threshold = max(1, self._rt.config.fusion_threshold_bytes)
        i = 0
        while i < len(wires):
            kind = wires[i][1].split("|", 1)[0]
            if kind != "allreduce":
                self._participate[kind](comm, [wires[i][1]])
                i += 1
                continue
            key = wires[i][1].split("|", 2)[1]
            j = i
            while j < len(wires) and wires[j][1].startswith(f"allreduce|{key}|"):
                j += 1
            run = [w for _, w in wires[i:j]]
            for chunk in fusion_chunks([int(w.rsplit("|", 1)[1]) for w in run], threshold):
                self._participate["allreduce"](comm, [run[k] for k in chunk])
            i = j

    # ------------------------------------------------------------------ shutdown

    def abandon(self, error: BaseException) -> None:
        """Fail every pending request with ``error`` and stop the thread, without talking
        to the other ranks (a member died: the communicators are revoked)."""
        with self._wake:
            pending, self._pending = self._pending, []
            self._names.clear()
            self._closing = True
            self._wake.notify()
        for request in pending:
            request.handle.part_done(error)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=_ABANDON_JOIN_S)

    def close(self) -> None:
        """Finish pending work, then stop the thread."""
        self.drain()
        with self._wake:
            self._closing = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join()


class _WaitedHere:
    """``Engine.waited_here()``: sets a thread-local flag for the block (a class, not a
    generator context manager, as it runs once per blocking collective)."""

    __slots__ = ("_here",)

    def __init__(self, here: threading.local):
        self._here = here

    def __enter__(self) -> None:
        self._here.waiting = True

    def __exit__(self, *exc_info) -> None:
        self._here.waiting = False


def _needs_communicator(request: Request) -> bool:
    """Whether ``request`` runs on the group's communicator even when groups all-reduce
    over the ring: anything but an all-reduce, and device tensors (NCCL / CUDA-aware MPI)."""
    return request.pair is None or request.pair[0].is_cuda


def fusion_chunks(sizes: Sequence[int], threshold: int) -> List[List[int]]:
    """Indices of consecutive items split into runs of at most ``threshold`` bytes (a bigger
    item runs alone). Every rank, joined or not, computes the same runs from the sizes."""
    chunks: List[List[int]] = []
    current: List[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if current and total + size > threshold:
            chunks.append(current)
            current, total = [], 0
        current.append(index)
        total += size
    if current:
        chunks.append(current)
    return chunks


_MIN_PAUSE_S = 20e-6
_ABANDON_JOIN_S = 5.0  # a thread inside a revoked communicator's call leaves at once
_MAX_PAUSE_S = 1e-3
