"""One PSOptimizer's session on one server: the dispatcher of its messages (``Session``).

Worker 0 sends ``init`` with the chunks this server owns and the optimizer to run on them
(kept by ``chunk_store.ChunkStore``). Every push says which chunk versions its gradient was
computed on, so staleness is measured on arrival. The session decodes a push's gradients
as views into its payload (``transport``), counts it and hands it to the handler of its
policy family (``pushes``, ``community_pushes``, ``task_pushes``); pulls and joins wait in
``answers.Answers``; ``state`` answers the optimizer state of every chunk, ``load``
replaces it; ``remap`` and ``adopt`` move chunks between servers (``migration``).

A failure while handling a well-formed request fails this session only: it is replaced by a
``FailedSession`` and every later request of it gets the error back.
"""
from __future__ import annotations

import time
from typing import Dict, List

import torch

from . import migration, policies
from .answers import Answers
from .chunk_store import ChunkStore
from .community_pushes import CommunityPushes
from .pushes import ArrivalPushes, PushHandler, RoundPushes
from .task_pushes import TaskPushes
from .transport import unpack


def make_handler(session) -> PushHandler:
    """The push handler of ``session``'s policy family."""
    name = session.spec.name
    if name in policies.TASK_POLICIES:
        return TaskPushes(session)
    if name == "casp":
        return CommunityPushes(session)
    if name in policies.ROUND_POLICIES:
        return RoundPushes(session)
    return ArrivalPushes(session)


class FailedSession:
    """A session whose setup or processing failed: every request gets the error back."""

    def __init__(self, server, error: str):
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
    """The state of one PSOptimizer on one server (``server``: the ``server.Server``)."""

    def __init__(self, server, init: dict):
        self.server = server
        self.sid = init["sid"]
        self.spec: policies.PolicySpec = init["spec"]
        self.delay_s = init["link_delay_s"]
        self.map_version = init["map_version"]
        self.timeout_s = init["timeout_s"]
        self.num_workers = server.num_workers
        self.store = ChunkStore(init)
        # Live migration (see migration.py): the map this server works under, maps
        # announced for a later round, chunks it waits for, messages of a newer map.
        self.owners = tuple(init.get("owners", ()))
        self.active_servers = tuple(init.get("active", ()))
        self.pending_maps: List[dict] = []
        self.incoming: set = set()
        self.future: List[dict] = []
        self.profiles: Dict[int, dict] = {}
        self.rounds = policies.Rounds(self.spec.quorum)
        self.pushes = [0] * self.num_workers
        self.applied_from = [0] * self.num_workers
        self.joined = set()
        self.dead = set(server.dead_workers)
        self.stats = {"bytes_in": 0, "bytes_out": 0, "busy_s": 0.0, "dropped": 0, "skipped": 0,
                      "staleness_hist": {}, "chunks_in": 0, "chunks_out": 0,
                      "bytes_moved_out": 0, "redirected_pulls": 0, "queued_for_newer_map": 0}
        self.handler = make_handler(self)
        self.answers = Answers(self)

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
        self.answers.fail_all(error)
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
            self.answers.add_pull(worker, message, began)
        elif kind == "task":
            self.handler.on_task_request(worker, message)
        elif kind == "join":
            self.answers.add_join(worker, message)
        elif kind == "stats":
            self.server.reply(worker, {"rid": message["rid"], "stats": self.snapshot()},
                              self.delay_s)
        elif kind == "state":
            self.server.reply(worker, {"rid": message["rid"], "state": self.store.get_state(),
                                       "versions": dict(self.store.versions)}, self.delay_s)
        elif kind == "load":
            self.store.load(message)
            self.server.reply(worker, {"rid": message["rid"]}, self.delay_s)
        self.stats["busy_s"] += time.monotonic() - began
        self.progress(time.monotonic())

    def on_push(self, worker: int, message: dict) -> None:
        """Decode and count a push, then hand it to the policy's handler."""
        if "prof" in message:
            self.profiles[worker] = message["prof"]
        grads = message["grads"] = self.decode(message)
        message["nbytes"] = sum(g.numel() * g.element_size() for g in grads.values())
        self.stats["bytes_in"] += message["nbytes"]
        self.pushes[worker] += 1
        if "hyper" in message:
            self.store.hyper_of[worker] = message["hyper"]
        message["use_hyper"] = self.store.hyper_for(worker)
        self.handler.on_push(worker, message)

    def decode(self, message: dict) -> Dict[int, torch.Tensor]:
        """The gradients a push carries, as views into its payload, by chunk id."""
        cids = message["chunks"]
        chunks = self.store.chunks
        missing = [cid for cid in cids if cid not in chunks]
        if missing:
            raise ValueError(f"push from worker {message['w']} carries chunks {missing} that "
                             f"server {self.server.index} does not own (map version "
                             f"{message.get('map')}, this server holds {self.map_version})")
        message["_buffer"] = message.pop("_payload", None)
        views = unpack(message["_buffer"], [(chunks[cid].numel(), chunks[cid].dtype)
                                            for cid in cids])
        return dict(zip(cids, views))

    def release(self, message: dict) -> None:
        """Give a push's payload back to the pool once its gradients have been used (the
        views into it are dropped: ``ChunkStore.apply`` clears the chunks' ``grad``)."""
        buffer = message.pop("_buffer", None)
        message["grads"] = {}
        if buffer is not None:
            self.server.pool.give(buffer)

    def record(self, worker: int, delay: int) -> None:
        """Count a push of ``worker`` applied (or kept) with staleness ``delay``."""
        hist = self.stats["staleness_hist"]
        hist[delay] = hist.get(delay, 0) + 1
        self.applied_from[worker] += 1

    # -- progress ------------------------------------------------------------------------
    def active(self) -> set:
        return set(range(self.num_workers)) - self.joined - self.dead

    def progress(self, now: float) -> None:
        self.handler.close()
        if not self.incoming:  # answers wait for the chunks this server is taking over
            self.answers.answer(now)

    def snapshot(self) -> dict:
        """This session's statistics on this server (``PSOptimizer.metrics``' server_load)."""
        store = self.store
        stats = dict(self.stats)
        stats["staleness_hist"] = dict(stats["staleness_hist"])
        stats["updates"] = store.updates
        stats["pushes_per_worker"] = list(self.pushes)
        stats["applied_per_worker"] = list(self.applied_from)
        stats["versions"] = dict(store.versions)
        stats["dead"] = sorted(self.dead)
        stats["chunks"] = sorted(store.chunks)
        stats["map_version"] = self.map_version
        stats["rounds_applied"] = self.rounds.applied
        stats["server_busy_s"] = self.server.busy_s
        stats["checksum"] = {cid: float(t.double().sum()) for cid, t in store.chunks.items()}
        self.handler.add_stats(stats)
        return stats
