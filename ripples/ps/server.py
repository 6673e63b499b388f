"""The parameter-server loop: holds chunks, applies pushes by policy, answers pulls.

One ``Session`` per PSOptimizer (worker 0 sends ``init`` with the chunks it owns here and
the optimizer to run on them). Messages of a session whose ``init`` has not arrived yet are
kept and replayed. Every chunk carries a version (updates applied to it); every push says
which versions its gradient was computed on, so staleness is measured on arrival.

Hyperparameters: ``init`` carries worker 0's parameter groups; a push carries a worker's
groups whenever they changed since its previous push. A round (BSP, Sync-opt) is applied
with the values of the lowest-numbered worker whose push is in it; an update applied on
arrival uses the values of the worker that pushed it. A push marked ``skip`` (its gradients
were not finite under a GradScaler) is never applied; a round containing one is skipped
by every server, as a synchronous step on the averaged gradient would be. A push leaves out
chunks without a gradient: a round averages the gradients present over all its pushes
(missing ones count as zero), and a chunk with no gradient at all is not stepped.

``state`` answers the optimizer state of every chunk; ``load`` (worker 0, from
``load_state_dict``) replaces chunks, their optimizer state and the hyperparameters.

Communities (``casp``): a push comes from a community's leader and names its members; it
is applied on arrival and counts as one round for every member. Server 0 keeps the
community controller (``casp.Controller``) and sends the current plan with every answer to
a pull, so a leader learns a new plan at a round boundary.

Tasks (``epsp``, ``flexrr``): server 0 keeps the ``tasks.TaskBoard`` and answers ``task``
requests (claims of ``count`` tasks, and steals) with the tasks granted and how many of the
worker's own share are still unclaimed. A push carries the summed gradients of the tasks a
worker computed for one clock and their ids; a clock's round is applied, as the sum over the
clock's tasks divided by their number, once all of them have arrived, in clock order. A
task pushed twice fails the session (every server checks; server 0 also checks that the
pusher claimed it).

Transport and robustness: a push's gradients arrive as a payload after its header
(``transport``) and are applied as views into it; the buffer goes back to the pool once
applied. A request whose header is malformed (not a dict, another protocol version, an
unknown kind, missing fields, a ``w`` that is not its sender) is answered with an error
naming the problem and dropped; the server keeps serving. A failure while handling a
well-formed request fails that session only (every later request of it gets the error).

Elastic servers: a server whose index is not in the session's active servers is a spare
and holds nothing; ``remap`` and ``adopt`` move chunks between servers at a round
boundary (``migration``). ``RIPPLES_SERVER_SLOWDOWN`` emulates slow servers (``slowness``).

Waiting rules: a pull held back by the policy (BSP, Sync-opt, SSP) is answered with an
error naming the workers it waits for once it has waited ``timeout_s``; a join waits for
the other workers while they are alive (heartbeats to the joined worker keep its deadline
from expiring) and treats a worker silent for ``timeout_s`` as dead (logged).
"""
from __future__ import annotations

import heapq
import itertools
import sys
import time
from typing import Dict, List

import torch
from mpi4py import MPI

from . import casp, migration, policies, slowness, tasks
from .transport import (PROTOCOL, REPLY, REQUEST, Backoff, BufferPool, Outbox, from_wire,
                        pack, receive, state_from_wire, state_to_wire, unpack)


def serve(comm, num_servers: int, timeout_s: float, cost_settings=None) -> None:
    """Run this rank's server until every worker has said goodbye. ``cost_settings``: the
    slowness settings (``slowness.from_env``'s mapping), None for none."""
    # The first optimizer built in a process imports torch's compiler stack (seconds on a
    # busy machine). Pay that now, while the workers build their own models and optimizers,
    # rather than inside the first session's setup, which the workers' timeout covers.
    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.0)
    Server(comm, num_servers, timeout_s, cost_settings or {}).run()


class Server:
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
            while self.comm.Iprobe(source=MPI.ANY_SOURCE, tag=REQUEST, status=status):
                began = time.monotonic()
                self.take(status.Get_source())
                self.busy_s += time.monotonic() - began
                busy = True
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
            self.later(delay, lambda: self.leave(worker))
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


    def leave(self, worker: int) -> None:
        self.byes.add(worker)
        for session in self.sessions.values():
            session.joined.add(worker)


KINDS = {"bye", "init", "push", "pull", "task", "join", "stats", "state", "load", "remap"}
REQUIRED = {"push": ("clock", "chunks", "computed_on", "factor"), "pull": ("after",),
            "task": ("clock", "steal"), "load": ("params", "state", "groups"),
            "remap": ("version", "owners", "active", "effective"),
            "init": ("chunks", "spec", "opt_class", "defaults", "groups", "map_version")}


class FailedSession:
    """A session whose setup or processing failed: every request gets the error back."""

    def __init__(self, server: Server, error: str):
        self.server = server
        self.error = error
        self.delay_s = 0.0
        self.joined = set()

    def deliver(self, message: dict) -> None:
        if message["kind"] not in ("push", "adopt"):
            self.server.reply(message["w"], {"rid": message["rid"], "error": self.error})

    def tick(self, now: float) -> None:
        pass


class Session:
    """The state of one PSOptimizer on one server."""

    def __init__(self, server: Server, init: dict):
        self.server = server
        self.sid = init["sid"]
        self.spec: policies.PolicySpec = init["spec"]
        self.delay_s = init["link_delay_s"]
        self.map_version = init["map_version"]
        self.timeout_s = init["timeout_s"]
        self.num_workers = server.num_workers
        self.chunks: Dict[int, torch.Tensor] = {}
        self.versions: Dict[int, int] = {}
        self.group_of: Dict[int, int] = {}
        for cid, group, array in init["chunks"]:
            self.chunks[cid] = from_wire(array)
            self.versions[cid] = 0
            self.group_of[cid] = group
        self.opt_class, self.defaults = init["opt_class"], init["defaults"]
        self.optimizer = None
        self.group_ids: List[int] = []  # the worker's group index of each local group
        self.default_hyper = self.current_hyper = init["groups"]
        self.hyper_of: Dict[int, list] = {}  # the groups each worker sent last
        self.adopted_state: Dict[int, dict] = {}
        self.rebuild_optimizer()
        if self.optimizer is not None:
            self.set_state(init.get("state", {}))
        # Live migration (see migration.py): the map this server works under, maps
        # announced for a later round, chunks it waits for, messages of a newer map.
        self.owners = tuple(init.get("owners", ()))
        self.active_servers = tuple(init.get("active", ()))
        self.pending_maps: List[dict] = []
        self.incoming: set = set()
        self.future: List[dict] = []
        self.profiles: Dict[int, dict] = {}
        self.rounds = policies.Rounds(self.spec.quorum)
        self.buffered: Dict[tuple, dict] = {}
        self.pushes = [0] * self.num_workers
        self.applied_from = [0] * self.num_workers
        self.joined = set()
        self.leaving: set = set()  # CASP workers serving their community's last rounds
        self.dead = set()
        self.pulls: List[tuple] = []
        self.joins: List[tuple] = []
        self.stats = {"bytes_in": 0, "bytes_out": 0, "busy_s": 0.0, "updates": 0, "dropped": 0,
                      "skipped": 0,
                      "staleness_hist": {}, "pushes_per_worker": self.pushes,
                      "applied_per_worker": self.applied_from, "chunks_in": 0,
                      "chunks_out": 0, "bytes_moved_out": 0, "redirected_pulls": 0,
                      "queued_for_newer_map": 0}
        self.last_heartbeat = time.monotonic()
        self.controller = None
        self.board = None
        self.clock_parts: Dict[int, dict] = {}
        if self.spec.name == "casp":
            self.stats["bytes_in_per_community"] = {}
            if server.index == 0:
                count = None if self.spec.communities == "auto" else self.spec.communities
                self.controller = casp.Controller(self.num_workers, count, self.spec.regroup_every)
        if self.spec.name in policies.TASK_POLICIES:
            self.stats["tasks_applied"] = 0
            if server.index == 0:
                self.board = tasks.TaskBoard(
                    self.num_workers, self.spec.tasks_per_clock, self.spec.staleness,
                    self.spec.rebalance_every,
                    rule="projection" if self.spec.name == "epsp" else "most_remaining")

    # -- arrival -------------------------------------------------------------------------
    def deliver(self, message: dict) -> None:
        if self.delay_s > 0:
            self.server.later(self.delay_s, lambda: self.handle(message))
        else:
            self.handle(message)

    def handle(self, message: dict) -> None:
        try:
            self.dispatch(message)
        except Exception as exc:  # noqa: BLE001 - the workers must hear about it, not hang
            sender = (f"worker {message['w']}" if "w" in message
                      else f"server {message.get('server')}")
            failed = self.fail(f"failed handling {message['kind']!r} from {sender}: {exc!r}")
            failed.deliver(message)

    def tick(self, now: float) -> None:
        try:
            self.progress(now)
        except Exception as exc:  # noqa: BLE001
            self.fail(f"failed applying updates: {exc!r}")

    def fail(self, error: str) -> FailedSession:
        """Replace this session by one that answers every request with ``error``."""
        failed = FailedSession(self.server, error)
        failed.joined = self.joined
        self.server.sessions[self.sid] = failed
        for worker, rid, *_ in self.pulls + self.joins:
            self.server.reply(worker, {"rid": rid, "error": error})
        self.pulls, self.joins = [], []
        return failed

    def dispatch(self, message: dict) -> None:
        began = time.monotonic()
        kind, worker = message["kind"], message.get("w")
        if migration.waits(self, message):
            self.future.append(message)
            self.stats["queued_for_newer_map"] += 1
            return
        if kind == "adopt":
            migration.on_adopt(self, message)
        elif kind == "remap":
            migration.on_remap(self, message)
        elif kind == "push":
            self.on_push(worker, message)
        elif kind == "pull":
            if message.get("map", self.map_version) < self.map_version:
                self.stats["redirected_pulls"] += 1  # answered with the chunks held now
            self.pulls.append((worker, message["rid"], message["after"], began))
        elif kind == "task":
            self.on_task_request(worker, message)
        elif kind == "join":
            self.joined.add(worker)
            self.joins.append((worker, message["rid"]))
        elif kind == "stats":
            self.server.reply(worker, {"rid": message["rid"], "stats": self.snapshot()}, self.delay_s)
        elif kind == "state":
            self.server.reply(worker, {"rid": message["rid"], "state": self.get_state(),
                                       "versions": dict(self.versions)}, self.delay_s)
        elif kind == "load":
            self.load(message)
            self.server.reply(worker, {"rid": message["rid"]}, self.delay_s)
        self.stats["busy_s"] += time.monotonic() - began
        self.progress(time.monotonic())

    def decode(self, message: dict) -> Dict[int, torch.Tensor]:
        """The gradients a push carries, as views into its payload, by chunk id."""
        cids = message["chunks"]
        missing = [cid for cid in cids if cid not in self.chunks]
        if missing:
            raise ValueError(f"push from worker {message['w']} carries chunks {missing} that "
                             f"server {self.server.index} does not own (map version "
                             f"{message.get('map')}, this server holds {self.map_version})")
        message["_buffer"] = message.pop("_payload", None)
        views = unpack(message["_buffer"],
                       [(self.chunks[cid].numel(), self.chunks[cid].dtype) for cid in cids])
        return dict(zip(cids, views))

    def release(self, message: dict) -> None:
        """Give a push's payload back to the pool once its gradients have been used (the
        views into it are dropped: ``apply`` clears the chunks' ``grad``)."""
        buffer = message.pop("_buffer", None)
        message["grads"] = {}
        if buffer is not None:
            self.server.pool.give(buffer)

    def on_push(self, worker: int, message: dict) -> None:
        if "prof" in message:
            self.profiles[worker] = message["prof"]
        grads = message["grads"] = self.decode(message)
        message["nbytes"] = sum(g.numel() * g.element_size() for g in grads.values())
        self.stats["bytes_in"] += message["nbytes"]
        self.pushes[worker] += 1
        if "hyper" in message:
            self.hyper_of[worker] = message["hyper"]
        message["use_hyper"] = self.hyper_of.get(worker, self.default_hyper)
        if self.spec.name in policies.TASK_POLICIES:
            self.on_task_push(worker, message)
            return
        if self.spec.name == "casp":
            self.on_community_push(message)
        if self.spec.name in policies.ROUND_POLICIES:
            if self.rounds.offer(worker, message["clock"]):
                self.buffered[(message["clock"], worker)] = message
            else:
                self.stats["dropped"] += 1
                self.release(message)
            return
        delay = self.delay_of(message)
        if message.get("skip"):
            self.stats["skipped"] += 1
        else:
            factor = policies.apply_factor(self.spec, delay, message["factor"])
            self.use_hyper(message["use_hyper"])
            self.apply(grads, factor)
        self.release(message)
        self.record(worker, delay)

    def on_community_push(self, message: dict) -> None:
        """Count the round for every member, feed the controller (server 0)."""
        members = message["members"]
        key = ",".join(map(str, members))
        per = self.stats["bytes_in_per_community"]
        per[key] = per.get(key, 0) + message["nbytes"]
        for w in members:
            if w != message["w"]:
                self.pushes[w] += 1
        if self.controller is not None:
            casp.observe(self.controller, message["plan"], members, message["times"])
            # Once a worker is leaving, a new plan could put it in a community that would
            # wait for it forever: the communities stay as they are.
            self.leaving.update(message.get("leaving", ()))
            if not self.joined and not self.leaving:
                casp.regroup(self.controller)

    def on_task_request(self, worker: int, message: dict) -> None:
        if self.board is None:
            raise ValueError(f"task request from worker {worker} reached server "
                             f"{self.server.index}; server 0 keeps the tasks")
        if message.get("task_s") is not None:
            tasks.observe(self.board, worker, message["task_s"])
        clock = message["clock"]
        if message["steal"]:
            task = tasks.steal(self.board, worker, clock, self.rounds.applied,
                               message.get("ahead", 0))
            granted = [] if task is None else [task]
        else:
            granted = tasks.claim(self.board, worker, clock, message.get("count", 1))
        self.server.reply(worker, {"rid": message["rid"], "tasks": granted,
                                   "left": tasks.unclaimed(self.board, worker, clock),
                                   "rounds": self.rounds.applied}, self.delay_s)

    def on_task_push(self, worker: int, message: dict) -> None:
        """Add one worker's summed task gradients to its clock; apply complete clocks."""
        clock, ids = message["clock"], message["tasks"]
        if clock < self.rounds.applied:
            raise ValueError(f"worker {worker} pushed tasks {ids} of clock {clock}, "
                             f"already applied")
        part = self.clock_parts.setdefault(clock, {"grads": {}, "ids": set(), "skip": False,
                                                    "hyper": None, "lowest": None})
        twice = part["ids"].intersection(ids)
        if twice or len(set(ids)) != len(ids):
            raise ValueError(f"tasks {sorted(twice) or ids} of clock {clock} pushed twice "
                             f"(worker {worker}): each task must be applied exactly once")
        if self.board is not None:
            tasks.complete(self.board, worker, clock, ids)
        part["ids"].update(ids)
        part["skip"] = part["skip"] or bool(message.get("skip"))
        if part["lowest"] is None or worker < part["lowest"]:
            part["lowest"], part["hyper"] = worker, message["use_hyper"]
        for cid, g in message["grads"].items():
            part["grads"][cid] = part["grads"][cid] + g if cid in part["grads"] else g.clone()
        self.release(message)
        self.record(worker, self.delay_of(message))
        self.close_task_rounds()

    def close_task_rounds(self) -> None:
        total = self.spec.tasks_per_clock
        while len(self.clock_parts.get(self.rounds.applied, {}).get("ids", ())) == total:
            part = self.clock_parts.pop(self.rounds.applied)
            if part["skip"]:
                self.stats["skipped"] += 1
            else:
                self.use_hyper(part["hyper"])
                self.apply({cid: g / total for cid, g in part["grads"].items()}, 1.0)
            self.stats["tasks_applied"] += total
            self.rounds.applied += 1

    def rebuild_optimizer(self) -> None:
        """A fresh local optimizer over the chunks held now (after chunks came or went),
        keeping every remaining chunk's state and taking the state of adopted ones."""
        state = dict(self.optimizer.state) if self.optimizer is not None else {}
        for cid, wire in self.adopted_state.items():
            if wire:
                state[self.chunks[cid]] = state_from_wire(wire)
        self.adopted_state = {}
        groups: Dict[int, list] = {}
        for cid in sorted(self.chunks):
            groups.setdefault(self.group_of[cid], []).append(self.chunks[cid])
        self.group_ids = sorted(groups)
        self.optimizer = None
        if groups:
            self.optimizer = self.opt_class(
                [dict(self.current_hyper[g], params=groups[g]) for g in self.group_ids],
                **self.defaults)
            for tensor in self.chunks.values():
                if tensor in state:
                    self.optimizer.state[tensor] = state[tensor]

    def use_hyper(self, groups: list) -> None:
        """Give the local optimizer's groups the values of the workers' ``groups``."""
        self.current_hyper = groups
        if self.optimizer is not None:
            for local, gid in zip(self.optimizer.param_groups, self.group_ids):
                local.update(groups[gid])

    def get_state(self) -> Dict[int, dict]:
        """Every chunk's optimizer state, as ``state_to_wire`` messages."""
        state = self.optimizer.state if self.optimizer is not None else {}
        return {cid: state_to_wire(state.get(t, {}), t.shape, 0, t.numel())
                for cid, t in self.chunks.items()}

    def set_state(self, wire: Dict[int, dict]) -> None:
        for cid, chunk_state in wire.items():
            tensor = self.chunks[cid]
            self.optimizer.state.pop(tensor, None)
            if chunk_state:
                self.optimizer.state[tensor] = state_from_wire(chunk_state)

    def load(self, message: dict) -> None:
        """Replace parameters, optimizer state and hyperparameters (``load_state_dict``)."""
        with torch.no_grad():
            for cid, array in message["params"].items():
                self.chunks[cid].copy_(from_wire(array))
        self.default_hyper = message["groups"]
        self.hyper_of = {}
        if self.optimizer is not None:
            self.set_state(message["state"])
            self.use_hyper(self.default_hyper)

    def delay_of(self, message: dict) -> int:
        seen = message["computed_on"]
        return max((self.versions[cid] - seen[cid] for cid in seen), default=0)

    def record(self, worker: int, delay: int) -> None:
        hist = self.stats["staleness_hist"]
        hist[delay] = hist.get(delay, 0) + 1
        self.applied_from[worker] += 1

    def apply(self, grads: Dict[int, torch.Tensor], factor: float) -> None:
        """One optimizer step on this server's chunks with the learning rate times ``factor``."""
        if self.optimizer is not None:
            for cid, tensor in self.chunks.items():
                tensor.grad = grads[cid].to(tensor.dtype) if cid in grads else None
            saved = [group.get("lr") for group in self.optimizer.param_groups]
            if factor != 1.0:
                for group, lr in zip(self.optimizer.param_groups, saved):
                    if lr is not None:
                        group["lr"] = lr * factor
            self.optimizer.step()
            for tensor in self.chunks.values():
                tensor.grad = None  # may be a view into a payload that goes back to the pool
            for group, lr in zip(self.optimizer.param_groups, saved):
                if lr is not None:
                    group["lr"] = lr
        for cid in self.chunks:
            self.versions[cid] += 1
        self.stats["updates"] += 1

    # -- progress ------------------------------------------------------------------------
    def active(self) -> set:
        return set(range(self.num_workers)) - self.joined - self.dead

    def close_rounds(self) -> None:
        while not self.incoming and self.rounds.ready(self.active()):
            clock = self.rounds.applied
            kept, late = self.rounds.close()
            self.stats["dropped"] += len(late)
            messages = [self.buffered.pop((clock, w)) for w in kept]
            for w in late:
                self.release(self.buffered.pop((clock, w), {}))
            if any(message.get("skip") for message in messages):
                self.stats["skipped"] += 1
            else:
                total = {}
                for message in messages:
                    for cid, g in message["grads"].items():
                        total[cid] = total[cid] + g if cid in total else g
                self.use_hyper(messages[kept.index(min(kept))]["use_hyper"])
                self.apply({cid: g / len(messages) for cid, g in total.items()}, 1.0)
            for message, w in zip(messages, kept):
                self.record(w, self.delay_of_round(message))
                self.release(message)
            migration.switch_due(self)

    def delay_of_round(self, message: dict) -> int:
        # The round's update was counted in ``versions`` already.
        return max(0, self.delay_of(message) - 1)

    def progress(self, now: float) -> None:
        if self.spec.name in policies.ROUND_POLICIES:
            self.close_rounds()
        if not self.incoming:  # answers wait for the chunks this server is taking over
            self.answer_pulls(now)
            self.answer_joins(now)

    def answer_pulls(self, now: float) -> None:
        waiting = []
        active = self.active()
        active_pushes = [self.pushes[w] for w in active]
        for worker, rid, after, since in self.pulls:
            if policies.pull_ready(self.spec, after, self.rounds.applied, self.pushes[worker],
                                   active_pushes):
                self.send_params(worker, rid, {"min_pushes": min(active_pushes or [0])})
            elif now - since > self.timeout_s:
                self.server.reply(worker, {"rid": rid, "error": self.blocked_on(worker, after)})
            else:
                waiting.append((worker, rid, after, since))
        self.pulls = waiting

    def blocked_on(self, worker: int, after: int) -> str:
        if self.spec.name in policies.TASK_POLICIES:
            have = len(self.clock_parts.get(self.rounds.applied, {}).get("ids", ()))
            return (f"policy {self.spec.name!r}: clock {self.rounds.applied} has "
                    f"{have} of {self.spec.tasks_per_clock} tasks after {self.timeout_s:.1f} s "
                    f"(a worker dead or stuck?)")
        if self.spec.name in policies.ROUND_POLICIES:
            missing = self.rounds.missing(self.active())
            return (f"policy {self.spec.name!r}: round {self.rounds.applied} still waits for "
                    f"workers {missing} after {self.timeout_s:.1f} s (dead or stuck?)")
        behind = [w for w in self.active()
                  if self.pushes[worker] - self.pushes[w] > self.spec.staleness]
        return (f"policy {self.spec.name!r} (staleness {self.spec.staleness}): worker {worker} waited "
                f"{self.timeout_s:.1f} s for workers {behind} to catch up (dead or stuck?)")

    def answer_joins(self, now: float) -> None:
        if not self.joins:
            return
        missing = self.active()
        if missing:
            silent = [w for w in missing if now - self.server.last_seen[w] > self.timeout_s]
            if silent and self.spec.name not in policies.ROUND_POLICIES + policies.TASK_POLICIES:
                print(f"ripples.ps server {self.server.index}: workers {silent} silent for "
                      f"{self.timeout_s:.1f} s, continuing without them", file=sys.stderr)
                self.dead.update(silent)
            elif silent:
                for worker, rid in self.joins:
                    self.server.reply(worker, {"rid": rid, "error": (
                        f"policy {self.spec.name!r}: workers {silent} silent for "
                        f"{self.timeout_s:.1f} s before joining (dead or stuck?)")})
                self.joins = []
                return
            if self.active() and now - self.last_heartbeat > self.timeout_s / 4:
                self.last_heartbeat = now
                for worker, rid in self.joins:
                    self.server.reply(worker, {"rid": rid, "heartbeat": True})
            if self.active():
                return
        for worker, rid in self.joins:
            self.send_params(worker, rid, {"stats": self.snapshot()})
        self.joins = []

    def send_params(self, worker: int, rid: int, extra: dict) -> None:
        cids = sorted(self.chunks)
        payload = pack(self.server.pool, [self.chunks[cid] for cid in cids])
        self.stats["bytes_out"] += payload.nbytes
        if self.server.cost is not None:
            self.server.cost.charge(payload.nbytes)
        message = {"rid": rid, "chunks": cids, "versions": dict(self.versions),
                   "map": self.map_version, "owners": self.owners, "active": self.active_servers,
                   "rounds": self.rounds.applied, "pushes": self.pushes[worker],
                   "total_pushes": sum(self.pushes),
                   "applied_mine": self.applied_from[worker], **extra}
        if worker == 0 and self.profiles:
            message["profiles"] = dict(self.profiles)
        if self.controller is not None:
            message["plan"] = (self.controller.version,
                               casp.labels(self.controller.plan, self.num_workers))
        self.server.reply(worker, message, self.delay_s, payload)

    def snapshot(self) -> dict:
        stats = dict(self.stats)
        stats["staleness_hist"] = dict(stats["staleness_hist"])
        stats["pushes_per_worker"] = list(self.pushes)
        stats["applied_per_worker"] = list(self.applied_from)
        stats["versions"] = dict(self.versions)
        stats["dead"] = sorted(self.dead)
        stats["chunks"] = sorted(self.chunks)
        stats["map_version"] = self.map_version
        stats["rounds_applied"] = self.rounds.applied
        stats["server_busy_s"] = self.server.busy_s
        stats["checksum"] = {cid: float(t.double().sum()) for cid, t in self.chunks.items()}
        if self.controller is not None:
            stats["communities"] = [list(c) for c in self.controller.plan]
            stats["plan_version"] = self.controller.version
            stats["plan_history"] = [(v, [list(c) for c in p]) for v, p in self.controller.history]
            stats["speed_ema_s"] = dict(self.controller.times)
        if self.board is not None:
            stats["tasks"] = {key: (list(value) if isinstance(value, list) else value)
                              for key, value in self.board.stats.items()}
            stats["task_time_ema_s"] = dict(self.board.task_time)
            stats["task_accounting"] = {
                c: {"claimed": dict(t.claimed), "done": sorted(t.done)}
                for c, t in self.board.clocks.items()}
        return stats
