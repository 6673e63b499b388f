"""The parameter-server loop: receives every rank's requests and hands them to sessions.

One ``session.Session`` per PSOptimizer holds chunks, applies pushes by policy and answers
pulls. Messages of a session whose ``init`` has not arrived yet are kept and replayed.

Transport and robustness: a push's gradients arrive as a payload after its header
(``transport``) and are applied as views into it; the buffer goes back to the pool once
applied. A request whose header is malformed (not a dict, another protocol version, an
unknown kind, missing fields, a ``w`` that is not its sender) is answered with an error
naming the problem and dropped; the server keeps serving. A failure while handling a
well-formed request fails that session only (every later request of it gets the error).

Elastic servers: a server whose index is not in the session's active servers is a spare
and holds nothing; ``remap`` and ``adopt`` move chunks between servers at a round
boundary (``migration``). ``RIPPLES_SERVER_SLOWDOWN`` emulates slow servers (``slowness``).
"""
from __future__ import annotations

import heapq
import itertools
import sys
import time
from typing import Dict, List

import torch
from mpi4py import MPI

from ..comm import failures
from . import slowness
from .session import FailedSession, Session
from .transport import PROTOCOL, REPLY, REQUEST, Backoff, BufferPool, Outbox, receive


def serve(comm, num_servers: int, timeout_s: float, cost_settings=None) -> None:
    """Run this rank's server until every worker has said goodbye. ``cost_settings``: the
    slowness settings (``slowness.from_env``'s mapping), None for none."""
    # The first optimizer built in a process imports torch's compiler stack (seconds on a
    # busy machine). Pay that now, while the workers build their own models and optimizers,
    # rather than inside the first session's setup, which the workers' timeout covers.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    Server(comm, num_servers, timeout_s, cost_settings or {}).run()


class Server:
    """One server rank: its sessions by id, requests kept for sessions not set up yet,
    delayed actions (emulated link latency) and the workers that said goodbye."""

    def __init__(self, comm, num_servers: int, timeout_s: float, cost_settings=None):
        self.comm = comm
        self.index = comm.Get_rank()
        self.cost = slowness.from_env(self.index, num_servers, cost_settings or {})
        self.busy_s = 0.0
        self.num_servers = num_servers
        self.num_workers = comm.Get_size() - num_servers
        self.timeout_s = timeout_s
        self.outbox = Outbox(comm)
        self.pool = BufferPool()
        self.sessions: Dict[int, Session] = {}
        self.early: Dict[int, List[dict]] = {}
        self.byes = set()
        self.deaths = failures.DeathWatch(comm)
        self.dead_workers: set = set()
        self.last_seen = {w: time.monotonic() for w in range(self.num_workers)}
        self.delayed: list = []
        self.sequence = itertools.count()

    def reply(self, worker: int, message: dict, delay_s: float = 0.0, payload=None) -> None:
        """Answer ``worker``; ``payload`` (a buffer of ``self.pool``) goes back to the pool
        once sent."""
        def send():
            done = None if payload is None else (lambda: self.pool.give(payload))
            self.outbox.send(self.num_servers + worker, message, REPLY, payload, done)
        if delay_s > 0:
            self.later(delay_s, send)
        else:
            send()

    def later(self, delay_s: float, action) -> None:
        heapq.heappush(self.delayed, (time.monotonic() + delay_s, next(self.sequence), action))

    def run(self) -> None:
        backoff = Backoff()
        status = MPI.Status()
        last_tick = 0.0
        while len(self.byes) < self.num_workers:
            busy = False
            try:
                while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=REQUEST, status=status):
                    began = time.monotonic()
                    self.take(status.Get_source())
                    self.busy_s += time.monotonic() - began
                    busy = True
            except MPI.Exception as error:  # fault tolerant: a rank of the job died
                self.bury(self.deaths.absorb(error))
            now = time.monotonic()
            while self.delayed and self.delayed[0][0] <= now:
                heapq.heappop(self.delayed)[2]()
                busy = True
            if busy or now - last_tick > 0.01:
                for session in list(self.sessions.values()):
                    session.tick(now)
                last_tick = now
                self.busy_s += time.monotonic() - now
            self.outbox.progress()
            if busy:
                backoff.reset()
            else:
                backoff.idle()
        self.outbox.flush(time.monotonic() + self.timeout_s, f"parameter server {self.index}")

    def take(self, source: int) -> None:
        """Receive one request from ``source``; a malformed one is answered with an error
        (when it comes from a worker) and dropped, never ending this loop."""
        header = None
        try:
            header, payload = receive(self.comm, source, REQUEST, self.pool, self.timeout_s,
                                      f"parameter server {self.index}")
            problem = self.malformed(source, header)
            if problem is None:
                if payload is not None:
                    header["_payload"] = payload
                if self.cost is not None:
                    self.cost.charge(0 if payload is None else payload.nbytes)
                self.receive(header)
                return
        except Exception as exc:  # noqa: BLE001 - one bad message must not end the server
            if failures.is_process_failure(exc):
                raise  # its sender died while sending: run() buries it
            problem = f"could not handle the message: {exc!r}"
        print(f"ripples.ps server {self.index}: bad message from rank {source}: {problem}",
              file=sys.stderr, flush=True)
        if source >= self.num_servers:
            rid = header.get("rid") if isinstance(header, dict) else None
            self.outbox.send(source, {"rid": rid if isinstance(rid, int) else None,
                                      "error": f"bad message: {problem}"}, REPLY)

    def malformed(self, source: int, header) -> str:
        """Why ``header`` from rank ``source`` cannot be handled, or None."""
        if not isinstance(header, dict):
            return f"expected a dict header, got {type(header).__name__}"
        if header.get("v") != PROTOCOL:
            return (f"protocol version {header.get('v')!r}, this server speaks {PROTOCOL} "
                    f"(every rank must run the same ripples)")
        if source < self.num_servers:
            return None if header.get("kind") == "adopt" else "servers send only 'adopt'"
        worker = source - self.num_servers
        if header.get("w") != worker:
            return f"field 'w' is {header.get('w')!r}, the sender is worker {worker}"
        if header.get("kind") not in KINDS:
            return f"unknown kind {header.get('kind')!r} (known: {sorted(KINDS)})"
        if header["kind"] != "bye" and not isinstance(header.get("sid"), int):
            return f"field 'sid' must be an integer session id, got {header.get('sid')!r}"
        missing = [field for field in REQUIRED.get(header["kind"], ()) if field not in header]
        if missing:
            return f"a {header['kind']!r} request needs the fields {missing}"
        return None

    def receive(self, message: dict) -> None:
        if message["kind"] == "adopt":  # a chunk handed over by another server
            self.to_session(message)
            return
        worker = message["w"]
        self.last_seen[worker] = time.monotonic()
        kind = message["kind"]
        if kind == "bye":
            # A worker that leaves counts as joined everywhere; after its delayed messages.
            delay = max((s.delay_s for s in self.sessions.values()), default=0.0)
            self.later(delay, lambda: self.leave(worker, message.get("rid")))
            return
        if kind == "init":
            sid = message["sid"]
            try:
                self.sessions[sid] = Session(self, message)
            except Exception as exc:  # noqa: BLE001 - reported to the workers, not fatal here
                self.sessions[sid] = FailedSession(self, f"could not set up the session: {exc!r}")
            for queued in self.early.pop(sid, []):
                self.sessions[sid].deliver(queued)
        else:
            self.to_session(message)

    def to_session(self, message: dict) -> None:
        sid = message["sid"]
        if sid in self.sessions:
            self.sessions[sid].deliver(message)
        else:
            self.early.setdefault(sid, []).append(message)

    def bury(self, ranks) -> None:
        """Go on without the workers among ``ranks`` (ranks of the PS communicator that died,
        under fault tolerance): they count as departed, and BSP rounds close without them.
        A dead server's chunks are lost: its workers' requests fail, naming it."""
        for rank in ranks:
            if rank < self.num_servers:
                print(f"ripples.ps server {self.index}: parameter server {rank} died",
                      file=sys.stderr, flush=True)
                continue
            worker = rank - self.num_servers
            print(f"ripples.ps server {self.index}: worker {worker} (rank {rank}) died; going "
                  "on without it", file=sys.stderr, flush=True)
            self.dead_workers.add(worker)
            self.byes.add(worker)
            for session in self.sessions.values():
                session.dead.add(worker)

    def leave(self, worker: int, rid=None) -> None:
        """``worker`` said goodbye (request ``rid``): answered, so that the worker knows
        this server has not stopped (it ends the job otherwise, see ``PSContext.shutdown``)."""
        self.byes.add(worker)
        for session in self.sessions.values():
            session.joined.add(worker)
        if rid is not None:
            self.reply(worker, {"rid": rid, "kind": "bye"})


KINDS = {"bye", "init", "push", "pull", "task", "join", "stats", "state", "load", "remap"}
REQUIRED = {"push": ("clock", "chunks", "computed_on", "factor"), "pull": ("after",),
            "task": ("clock", "steal"), "load": ("params", "state", "groups"),
            "remap": ("version", "owners", "active", "effective"),
            "init": ("chunks", "spec", "opt_class", "defaults", "groups", "map_version")}
