"""The pulls and joins a server holds for one session, and when it answers them.

Waiting rules: a pull held back by the policy (BSP, Sync-opt, SSP, CASP, tasks; see
``policies.pull_ready``) is answered with an error naming the workers it waits for once it
has waited ``timeout_s``; a join waits for the other workers while they are alive
(heartbeats to the joined worker keep its deadline from expiring) and treats a worker silent
for ``timeout_s`` as dead (logged), except under policies that cannot go on without it
(rounds, tasks), where the join fails with an error naming the silent workers.

An answer carries this server's chunks as a payload after its header, their versions, the
chunk map it works under (a worker that pulled under an older map learns the newer one and
redirects, see ``migration``), the rounds applied and the pusher's counters.
"""
from __future__ import annotations

import sys
import time
from typing import List

from . import policies
from .transport import pack


class Answers:
    """Pulls (``worker, rid, after, since``) and joins (``worker, rid``) waiting for an
    answer in ``session`` (a ``session.Session``)."""

    def __init__(self, session):
        self.session = session
        self.pulls: List[tuple] = []
        self.joins: List[tuple] = []
        self.last_heartbeat = time.monotonic()

    def add_pull(self, worker: int, message: dict, since: float) -> None:
        session = self.session
        if message.get("map", session.map_version) < session.map_version:
            session.stats["redirected_pulls"] += 1  # answered with the chunks held now
        self.pulls.append((worker, message["rid"], message["after"], since))

    def add_join(self, worker: int, message: dict) -> None:
        self.session.joined.add(worker)
        self.joins.append((worker, message["rid"]))

    def fail_all(self, error: str) -> None:
        """Answer every waiting pull and join with ``error``."""
        for worker, rid, *_ in self.pulls + self.joins:
            self.session.server.reply(worker, {"rid": rid, "error": error})
        self.pulls, self.joins = [], []

    def answer(self, now: float) -> None:
        """Answer the pulls and joins that may be answered at ``now``."""
        self.answer_pulls(now)
        self.answer_joins(now)

    def answer_pulls(self, now: float) -> None:
        session = self.session
        waiting = []
        active = session.active()
        active_pushes = [session.pushes[w] for w in active]
        for worker, rid, after, since in self.pulls:
            if policies.pull_ready(session.spec, after, session.rounds.applied,
                                   session.pushes[worker], active_pushes):
                self.send_params(worker, rid, {"min_pushes": min(active_pushes or [0])})
            elif now - since > session.timeout_s:
                session.server.reply(worker, {"rid": rid, "error": session.handler.blocked_on(
                    worker, after)})
            else:
                waiting.append((worker, rid, after, since))
        self.pulls = waiting

    def answer_joins(self, now: float) -> None:
        session = self.session
        if not self.joins:
            return
        missing = session.active()
        if missing:
            silent = [w for w in missing if now - session.server.last_seen[w] > session.timeout_s]
            if silent and not session.handler.needs_everyone:
                print(f"ripples.ps server {session.server.index}: workers {silent} silent for "
                      f"{session.timeout_s:.1f} s, continuing without them", file=sys.stderr)
                session.dead.update(silent)
            elif silent:
                for worker, rid in self.joins:
                    session.server.reply(worker, {"rid": rid, "error": (
                        f"policy {session.spec.name!r}: workers {silent} silent for "
                        f"{session.timeout_s:.1f} s before joining (dead or stuck?)")})
                self.joins = []
                return
            if session.active() and now - self.last_heartbeat > session.timeout_s / 4:
                self.last_heartbeat = now
                for worker, rid in self.joins:
                    session.server.reply(worker, {"rid": rid, "heartbeat": True})
            if session.active():
                return
        for worker, rid in self.joins:
            self.send_params(worker, rid, {"stats": session.snapshot()})
        self.joins = []

    def send_params(self, worker: int, rid: int, extra: dict) -> None:
        session = self.session
        store = session.store
        cids = sorted(store.chunks)
        payload = pack(session.server.pool, [store.chunks[cid] for cid in cids])
        session.stats["bytes_out"] += payload.nbytes
        if session.server.cost is not None:
            session.server.cost.charge(payload.nbytes)
        message = {"rid": rid, "chunks": cids, "versions": dict(store.versions),
                   "map": session.map_version, "owners": session.owners,
                   "active": session.active_servers, "rounds": session.rounds.applied,
                   "pushes": session.pushes[worker], "total_pushes": sum(session.pushes),
                   "applied_mine": session.applied_from[worker], **extra}
        if worker == 0 and session.profiles:
            message["profiles"] = dict(session.profiles)
        message.update(session.handler.answer_fields())
        session.server.reply(worker, message, session.delay_s, payload)
