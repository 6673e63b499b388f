"""The Group Generator as a service: a thread on rank 0 of a private communicator answers
every rank's requests, and :class:`GeneratorSchedule` is the client each rank holds.

Protocol (pickled messages on the given communicator, which must be used for nothing
else): a client sends ``(op, rank, request_id)`` with tag ``TAG_REQUEST`` to rank 0 and waits
for one answer ``("ok", payload, request_id)`` or ``("error", text, request_id)`` with tag
``TAG_REPLY``; a late answer to a request that timed out carries an older id and is
dropped. ``op`` is
``"groups"`` (payload: the next ``(seq, group)`` pairs, possibly after the generator waits
for other workers), ``"leave"`` (payload: the pairs still buffered for the rank) or
``"close"`` (leave if not done, then stop; payload: pairs still buffered). Every request
gets exactly one answer, and the service thread stops once every rank has closed, after
its last answer has been delivered, so no message is left unmatched.

Client waits poll as the engine's waits do (``ripples.comm.mpi.poll_until``: a short spin,
then yielding the core, then naps of at most 200 us after 5 ms) against a deadline, so a
missing peer yields :class:`RipplesTimeoutError` instead of a hang. (Naps from the start,
doubling to 500 us, let an answer wait up to a nap: a request took 1.1 ms on 2 idle ranks,
0.53 ms with the spin; ``benchmarks/latency_after_idle.py``.) The service thread
probes for a request (``improbe``) and runs the generator's ``poll()`` only after a request
or a leave and at the generator's ``next_deadline()``. In between it sleeps in the kernel on
a doorbell (``doorbell.py``: every client rings a UDP socket after sending a request), until
a ring, the next deadline or at most ``doorbell.MAX_WAIT_S``; for ``BELL_GRACE_S`` after a
ring or a request, and while a reply is being sent, it polls with naps instead. Without a
doorbell (some rank could not make one) it always naps: naps start at ``poll_interval_s``
after activity and double up to ``MAX_NAP_S`` (500 us), or up to ``MAX_IDLE_NAP_S`` (10 ms)
once nothing has happened for ``IDLE_AFTER_S`` (1 s); no nap runs past the next deadline.
``stop()`` rings, and takes effect at once.

Why the thread does not block in an MPI receive: Open MPI 5 has none that sleeps. A
blocking receive (``comm.recv``, ``Mprobe``, ``Wait`` on an ``Irecv``) runs the progress
loop until a message comes. Measured by ``benchmarks/generator_service_cpu.py`` (4 ranks on
2 busy cores, each asking every 100 ms; ``benchmarks/results/generator_service_cpu.json``):
a service thread blocked in ``comm.recv`` used 98% of a core while idle, and 35% of a core
it shared with a compute thread, which lost half its speed. With ``mpi_yield_when_idle=1``
(Open MPI's default only in oversubscribed jobs; process-wide) it gave way to that compute
(1% of the core) but still burned 68-84% of a free core and answered in 5.7 ms (median)
beside compute; the ``nanosleep`` yield strategy cost 6-10% and slows every MPI wait of
the process. The nap loop used 1.0% of a core while idle (the former 100-500 us naps: 4-7%)
and 4-7% at 40 requests/s (as those naps: nearly all of it is waking up every 500 us
between requests), answering in about 1.2 ms (median, client polling included) on that
loaded machine. The doorbell's numbers are in the README ("Group Generator service").
"""
from __future__ import annotations

import collections
import threading
import time
from typing import List, Optional

from ..core.errors import RipplesError, RipplesTimeoutError
from .base import Assignment, Schedule, check_group_size
from ..comm import outbox
from ..comm.doorbell import Doorbell
from .generator import GroupGenerator
from .generator_checkpoint import generator_state, restore_generator_state

MAX_NAP_S = 5e-4
REQUEST_TIMES_KEPT = 10_000  # about 1 MB: minutes of requests, for their statistics
IDLE_AFTER_S = 1.0
MAX_IDLE_NAP_S = 1e-2
BELL_GRACE_S = 2e-3  # polling after a ring: its MPI message may still be on the way
TAG_REQUEST = 0x5251
TAG_REPLY = 0x5252
SERVICE_RANK = 0


def _mpi():
    from mpi4py import MPI
    return MPI


def require_thread_multiple() -> None:
    """Raise RipplesError unless MPI was initialized with MPI_THREAD_MULTIPLE."""
    MPI = _mpi()
    if MPI.Query_thread() != MPI.THREAD_MULTIPLE:
        raise RipplesError(
            "the group generator service needs MPI initialized with MPI_THREAD_MULTIPLE "
            f"(got thread level {MPI.Query_thread()}); keep mpi4py.rc.thread_level = "
            "'multiple' (the default) before importing mpi4py.MPI")


class GeneratorService:
    """Runs a :class:`GroupGenerator` in a background thread on rank 0 of ``comm``."""

    def __init__(self, comm, generator: GroupGenerator, poll_interval_s: float = 1e-4,
                 doorbell: Optional[Doorbell] = None):
        self.comm = comm
        self.generator = generator
        self.poll_interval_s = poll_interval_s
        self.doorbell = doorbell
        self.wakeups = 0  # sleeps that ended (naps and doorbell waits)
        self.closed: set = set()
        self.error: Optional[BaseException] = None
        self.last_activity = time.monotonic()
        self._stop = threading.Event()
        self._sends: list = []
        # worker -> (id, arrival time) of its outstanding "groups" request
        self._outstanding: dict = {}
        # No division runs before rank 0 restored a checkpoint or sent its first request:
        # a resumed run's groups must come from the restored generator whichever rank asks
        # first, and rank 0 loads a checkpoint before its first step in any script order.
        self._released = False
        self._poll_due = False  # a request or a deadline came since the last poll()
        # Held by the thread while it uses the generator, and by snapshot() and restore().
        self._generator_lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ripples-group-generator",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def is_alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> None:
        """Make the thread exit after its current nap (at most ``MAX_IDLE_NAP_S``; at once
        with a doorbell), even if some ranks never closed."""
        self._stop.set()
        if self.doorbell is not None:
            self.doorbell.ring()

    def join(self, timeout_s: float) -> None:
        """Wait for the thread; give up after ``timeout_s`` without service activity."""
        while self._thread.is_alive():
            self._thread.join(0.01)
            if time.monotonic() - self.last_activity > timeout_s:
                self.stop()
                self._thread.join(1.0)
                missing = sorted(set(range(self.comm.Get_size())) - self.closed)
                raise RipplesTimeoutError(
                    f"group generator on rank {SERVICE_RANK}: ranks {missing} did not close "
                    f"within {timeout_s}s of the last request")

    def _run(self) -> None:
        MPI = _mpi()
        size = self.comm.Get_size()
        nap = self.poll_interval_s
        deadline = None  # the generator's next_deadline(), known since its last event
        rung = time.monotonic()  # the last ring
        try:
            while len(self.closed) < size and not self._stop.is_set():
                if self._sends:
                    self._sends = [req for req in self._sends if not req.Test()]
                with self._generator_lock:
                    received = self._receive(MPI)
                    now = time.monotonic()
                    answers = None
                    if received or (deadline is not None and now >= deadline):
                        self._poll_due = True
                    if self._poll_due and self._released:  # only after an event or deadline
                        self._poll_due = False
                        answers = self.generator.poll()
                        for worker, pairs in answers.items():
                            request_id, arrived = self._outstanding.pop(worker)
                            self._send(worker, ("ok", pairs, request_id, now - arrived))
                        deadline = self.generator.next_deadline()
                if received or answers:
                    self.last_activity = now
                    nap = self.poll_interval_s
                    continue
                self.wakeups += 1
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                quiet = now - max(rung, self.last_activity) >= BELL_GRACE_S
                if self.doorbell is not None and quiet and not self._sends:
                    if self.doorbell.wait(left):
                        rung = time.monotonic()
                        nap = self.poll_interval_s
                    continue
                time.sleep(nap if left is None else min(nap, left))
                idle = now - self.last_activity >= IDLE_AFTER_S
                nap = min(MAX_IDLE_NAP_S if idle else MAX_NAP_S, nap * 2)
            while self._sends and not self._stop.is_set():
                self._sends = [req for req in self._sends if not req.Test()]
                time.sleep(self.poll_interval_s)
        except BaseException as exc:  # surfaced to the rank-0 client, which raises it
            self.error = exc
        finally:
            outbox.keep_until_complete(*self._sends)  # stopped: answers still in flight
            self._sends = []

    def snapshot(self) -> dict:
        """The generator's checkpoint state (``generator_checkpoint``)."""
        with self._generator_lock:
            return generator_state(self.generator)

    def restore(self, state: dict) -> None:
        """Make the generator go on from ``state`` (``generator_checkpoint``), and let
        the requests that came before it be answered."""
        with self._generator_lock:
            restore_generator_state(self.generator, state)
            self._released = self._poll_due = True
        if self.doorbell is not None:
            self.doorbell.ring()  # the thread may sleep on it with requests waiting

    def _receive(self, MPI) -> bool:
        # A probe that finds nothing still runs MPI's progress, which may only then take in
        # the message a ring announced: a second probe finds it without waiting for a nap.
        msg = (self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST)
               or self.comm.improbe(source=MPI.ANY_SOURCE, tag=TAG_REQUEST))
        if msg is None:
            return False
        op, rank, request_id = msg.recv()
        if rank == SERVICE_RANK:
            self._released = True
        try:
            if op == "groups":
                self.generator.request(rank)  # answered by poll()
                self._outstanding[rank] = (request_id, time.monotonic())
            elif op == "away":  # no answer: the client does not wait for one
                self.generator.away(rank)
            elif op == "back":  # after a join every rank completed; no answer either
                self.generator.rejoin(rank)
            elif op in ("leave", "close"):
                if op == "close":
                    self.closed.add(rank)
                self._outstanding.pop(rank, None)
                self._send(rank, ("ok", self.generator.leave(rank), request_id, 0.0))
            else:
                raise ValueError(f"unknown request {op!r}")
        except ValueError as exc:
            self._send(rank, ("error", str(exc), request_id, 0.0))
        return True

    def _send(self, rank: int, message) -> None:
        self._sends.append(self.comm.isend(message, dest=rank, tag=TAG_REPLY))


class GeneratorSchedule(Schedule):
    """Groups handed out by the Group Generator service (the ``"generator"`` schedule).

    Every rank of ``comm`` constructs one (``comm`` is a communicator private to the
    generator, e.g. ``MPI.COMM_WORLD.Dup()``); rank 0 also starts the service thread. Each
    request returns up to ``batch`` groups, kept locally and executed one per step, in
    order. ``close()`` must be called on every rank; on rank 0 it returns once every rank
    has closed (bounded by ``timeout_s`` without activity) and the thread has exited; with
    ``free_comm`` it then frees ``comm``. Other arguments are those of
    :class:`GroupGenerator`.

    A checkpoint keeps rank 0's generator state (``state()``, see ``generator_checkpoint``);
    a resumed run's rank 0 gives it back with ``restore()``. Groups a rank held but had not
    executed when it saved are dropped with the rest of the interrupted run. So that the
    first groups of a resumed run come from the restored generator, the service divides
    nothing before rank 0 restored or sent its first request: the other ranks' first
    requests wait for rank 0 to load its checkpoint (or reach its first step), within
    ``timeout_s``.
    """

    kind = "generator"
    lockstep = False  # groups form from the ranks that ask, whatever their step

    def __init__(self, comm, group_size: int, seed: int = 0, policy: str = "ready",
                 timeout_s: float = 60.0, batch: int = 1, poll_interval_s: float = 1e-4,
                 free_comm: bool = False, **generator_options):
        require_thread_multiple()
        rank, size = comm.Get_rank(), comm.Get_size()
        check_group_size(group_size, size)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be a positive number of seconds, got {timeout_s!r}")
        super().__init__(rank, size)
        self.group_size = group_size
        self.comm = comm
        self._free_comm = free_comm
        self.timeout_s = timeout_s
        self._held: collections.deque = collections.deque()
        self._away = False  # told the generator it left the training step
        self._sends: list = []  # "away" notices still being sent
        self._request_id = 0
        # (round trip, of which the generator held the request) of each "groups" request,
        # the most recent REQUEST_TIMES_KEPT: the rest is the service's cost (request_costs)
        self.request_times: collections.deque = collections.deque(maxlen=REQUEST_TIMES_KEPT)
        self._closed = False
        self._service: Optional[GeneratorService] = None
        self._ranks_per_node = generator_options.get("ranks_per_node")
        generator = GroupGenerator(size, group_size, seed=seed, policy=policy, batch=batch,
                                   **generator_options)  # validates on every rank alike
        self._doorbell = Doorbell.setup(comm, SERVICE_RANK)  # collective
        if rank == SERVICE_RANK:
            self._service = GeneratorService(comm, generator, poll_interval_s, self._doorbell)
            self._service.start()

    def settings(self) -> dict:
        return {**super().settings(), "group_size": self.group_size,
                "ranks_per_node": self._ranks_per_node}

    def state(self) -> dict:
        """On rank 0, which runs the generator, its checkpoint state; elsewhere empty."""
        return {} if self._service is None else {"generator": self._service.snapshot()}

    def restore(self, state: dict) -> None:
        """On rank 0, make the generator go on from the state rank 0 saved (the other ranks
        hold no generator state: loading another rank's checkpoint is fine)."""
        if self._service is not None and "generator" in state:
            self._service.restore(state["generator"])

    def groups_for_step(self, step: int) -> List[Assignment]:
        self._check_step(step)
        if not self._held:
            asked = time.perf_counter()
            groups, held_s = self._call("groups")
            self.request_times.append((time.perf_counter() - asked, held_s))
            self._held.extend(groups)
        return [self._held.popleft()]

    def away(self) -> None:
        """Tell the generator, without waiting for an answer, that this rank left the
        training step (see ``GroupGenerator.away``); its next request brings it back. Sent
        once per absence, only when it holds no groups (they are waited for)."""
        if self._away or self._held or self._left:
            return
        self._away = True
        self._notify("away")

    def rejoin(self) -> None:
        """Take part again after a ``join()`` that every rank completed: the generator
        counts this rank again (told without waiting for an answer; the next request,
        sent after it on the same tag, finds it counted)."""
        if not self._left or self._closed:
            return
        self._left = self._away = False
        self._notify("back")

    def _notify(self, op: str) -> None:
        """Send the service ``op``, which it does not answer, and ring its doorbell."""
        self._sends = [req for req in self._sends if not req.Test()]
        self._sends.append(self.comm.isend((op, self.rank, 0), dest=SERVICE_RANK,
                                           tag=TAG_REQUEST))
        if self._doorbell is not None:
            self._doorbell.ring()

    def leave(self) -> List[Assignment]:
        if self._left:
            return []
        remaining = list(self._held) + self._call("leave")[0]
        self._held.clear()
        self._left = True
        return remaining

    def close(self) -> None:
        """Stop using the generator (leaving first if needed) and, on rank 0, wait for the
        service thread to exit. Raises RipplesError if groups assigned to this rank were
        never executed (call ``leave()`` and execute them before ``close()``)."""
        if self._closed:
            return
        unexecuted = list(self._held) + self._call("close")[0]
        self._held.clear()
        self._closed = self._left = True
        try:
            if self._service is not None:
                self._service.join(self.timeout_s)
        finally:
            self._close_doorbell()
        self._raise_service_error()
        if self._free_comm:
            self.comm.Free()
        if unexecuted:
            raise RipplesError(f"rank {self.rank} closed the group generator schedule with "
                               f"unexecuted groups {unexecuted}; call leave() and execute "
                               "the groups it returns before close()")

    def abandon(self) -> None:
        """Stop at once (ranks died): revoke the generator's communicator, so that every
        rank waiting for an answer stops waiting, and stop the service thread."""
        from ripples.comm.failures import revoke
        self._closed = self._left = True
        self._held.clear()
        outbox.keep_until_complete(*self._sends)
        self._sends = []
        revoke([self.comm])
        if self._service is not None:
            self._service.stop()
            self._service._thread.join(1.0)
        self._close_doorbell()

    def _close_doorbell(self) -> None:
        if self._doorbell is not None:
            self._doorbell.close()
            self._doorbell = None

    def _call(self, op: str):
        from ripples.comm.mpi import Deadline, poll_until  # needs torch: load it when used
        if self._closed:
            raise RipplesError(f"rank {self.rank}: the group generator schedule is closed")
        self._request_id += 1
        self._away = False
        send = self.comm.isend((op, self.rank, self._request_id), dest=SERVICE_RANK,
                               tag=TAG_REQUEST)
        if self._doorbell is not None:
            self._doorbell.ring()
        answer = []  # the reply to this request, once it came and the request was sent

        def answered() -> bool:
            if not answer:
                msg = self.comm.improbe(source=SERVICE_RANK, tag=TAG_REPLY)
                if msg is not None:
                    reply = msg.recv()
                    if reply[2] == self._request_id:  # else: a late answer to a request
                        answer.append(reply)          # that timed out; dropped
            self._raise_service_error()
            if self._sends:
                self._sends = [req for req in self._sends if not req.Test()]
            return bool(answer) and send.Test() and not self._sends

        try:
            poll_until(answered, Deadline(
                self.timeout_s, self.timeout_s,
                lambda: (f"group generator (rank {SERVICE_RANK} of its communicator) did not "
                         f"answer {op!r} from rank {self.rank}")))
        except BaseException:
            outbox.keep_until_complete(send)  # may still be in flight to a late service
            raise
        status, payload, _, held_s = answer[0]
        if status != "ok":
            raise RipplesError(f"group generator refused {op!r} from rank {self.rank}: {payload}")
        return payload, held_s

    def division_reasons(self) -> dict:
        """On rank 0, which runs the generator, ``{reason: (divisions, ready workers they
        divided)}`` (``GroupGenerator.division_reasons``); elsewhere empty."""
        if self._service is None:
            return {}
        generator = self._service.generator
        return {reason: (count, generator.divided_by_reason[reason])
                for reason, count in generator.division_reasons.items()}

    def generator_events(self) -> list:
        """On rank 0, the generator's latest requests and divisions
        (``GroupGenerator.events``, times in seconds from the first); elsewhere empty."""
        if self._service is None or not self._service.generator.events:
            return []
        events = list(self._service.generator.events)
        start = events[0][1]
        return [(kind, round(at - start, 6), *rest) for kind, at, *rest in events]

    def request_costs(self) -> List[float]:
        """Seconds each kept "groups" request took beyond the time the generator held it
        waiting for a group: the two messages, the service thread's wake-up and the
        client's polling (what the simulator's ``service_s`` stands for)."""
        return [round_trip - held for round_trip, held in self.request_times]

    def _raise_service_error(self) -> None:
        if self._service is not None and self._service.error is not None:
            raise RipplesError("group generator service thread failed") from self._service.error
