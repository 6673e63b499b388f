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
from typing import Callable, Dict, List, Optional, Sequence

import torch

from ripples.comm.control import Record, negotiate
from ripples.core.errors import RipplesError, RipplesTimeoutError
from ripples.ops.executor import Executor
from ripples.ops.expiry import expire
from ripples.ops.handles import Handle
from ripples.ops.join_rounds import JoinRounds
from ripples.ops.native_lane import Lanes
from ripples.ops.request import Pair, Request, fusion_chunks, ring_can_carry  # noqa: F401


class Engine:
    """Pending requests of one rank and the thread that progresses them."""

    def __init__(self, runtime, reduce_fused: Callable, participate: Dict[str, Callable]):
        self._rt = runtime
        self._lock = threading.Lock()      # guards the pending list and names
        self._wake = threading.Condition(self._lock)
        self._comm_lock = threading.Lock()  # whoever holds it talks to the other ranks
        self._pending: List[Request] = []
        self._names: Dict[tuple, Request] = {}
        self._unnamed: Dict[tuple, int] = {}
        self._thread: Optional[threading.Thread] = None
        self._closing = False
        self._here = threading.local()
        self._waited_here = _WaitedHere(self._here)
        self._reduce_fused = reduce_fused  # (comm, group, active, requests) for one fused chunk
        # Looked up at each call, so that a test can replace the engine's data step.
        self._executor = Executor(runtime, lambda *args: self._reduce_fused(*args), self._finish)
        self.lanes = Lanes(runtime)  # the native lane's record rounds, per group
        self._joined = JoinRounds(runtime, participate, self._comm_lock, self._restart_names,
                                  self.lanes)

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
            self._executor.execute(comm, group, 1, batch)
            return True
        ring = self._executor.ring(group)
        # Over the ring, only what the ring cannot carry needs the group's communicator.
        need_create = comm is None and (ring is None or not all(
            ring_can_carry(r) and rt.ring_carries(group, r.nbytes) for r in batch))
        record = Record(group, need_create, -1, any(r.handle.blocking for r in batch),
                        [(r.name, r.signature, r.wire) for r in batch])
        what = batch[0].what
        start = rt.timeline.now() if rt.timeline.enabled else 0.0
        try:
            self.lanes.settle(group)
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
        self.lanes.finish(group)
        if decision.create:  # collective: a member cut off now would block it for good
            with rt.data_watch.phase(group, f"making the communicator of group {group}"):
                comm = rt.cache.create(group)
        by_name = {r.name: r for r in batch}
        for name, error in decision.failed.items():
            self._fail_unmatched([by_name[name]], error)
        agreed = [by_name[n] for n in decision.run]
        self._executor.execute(comm, group, decision.active, agreed, ring)
        if decision.active == len(group):  # a joined member takes no part in arming a lane
            self.lanes.consider(group, agreed, comm)
        progressed = bool(decision.run or decision.failed)
        if not progressed:
            expire(self._rt, batch, decision, self._fail_unmatched)
        return progressed

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
        every rank has joined (``JoinRounds``). Returns the rank that joined last. Unnamed
        collectives are counted afresh afterwards, so uneven work before the join leaves
        no trace."""
        self.drain()
        return self._joined.run()

    def _restart_names(self) -> None:
        with self._lock:
            self._unnamed.clear()

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
        self.lanes.close()


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


_MIN_PAUSE_S = 20e-6
_ABANDON_JOIN_S = 5.0  # a thread inside a revoked communicator's call leaves at once
_MAX_PAUSE_S = 1e-3
