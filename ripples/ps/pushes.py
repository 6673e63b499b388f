"""How a server applies the pushes of one session, one handler per policy family.

``ArrivalPushes`` (ASP, SSP, DynSGD, ConSGD, eager) applies each push on arrival, scaled
by the policy's factor; ``RoundPushes`` (BSP, Sync-opt) applies a round once the policy
closes it. Communities (``community_pushes``) and tasks (``task_pushes``) build on the same
``PushHandler`` face, which the session (``session.Session``) calls:

- ``on_push(worker, message)``: a decoded push (``message["grads"]``, its hyperparameters
  in ``message["use_hyper"]``); the handler applies or keeps it and gives the payload back
  with ``session.release`` once the gradients are used;
- ``close()``: apply what became ready (called before pulls are answered);
- ``blocked_on(worker, after)``: why a pull held back by the policy is still waiting;
- ``answer_fields()`` and ``add_stats(stats)``: what the family adds to pull answers and to
  the session's statistics.

A push marked ``skip`` (its gradients were not finite under a GradScaler) is never applied;
a round containing one is skipped by every server, as a synchronous step on the averaged
gradient would be. A push leaves out chunks without a gradient: a round averages the
gradients present over all its pushes (missing ones count as zero), and a chunk with no
gradient at all is not stepped.
"""
from __future__ import annotations

from typing import Dict

from . import migration, policies


class PushHandler:
    """What every policy family shares; ``session`` is the ``session.Session`` it serves.

    ``needs_everyone``: True when the policy cannot go on without a silent worker (a join
    then fails instead of continuing without it).
    """

    needs_everyone = False

    def __init__(self, session):
        self.session = session
        self.spec: policies.PolicySpec = session.spec

    def on_push(self, worker: int, message: dict) -> None:
        raise NotImplementedError

    def on_task_request(self, worker: int, message: dict) -> None:
        raise ValueError(f"task request from worker {worker} reached server "
                         f"{self.session.server.index}; server 0 keeps the tasks")

    def close(self) -> None:
        """Apply whatever the policy lets apply now (nothing for updates applied on arrival)."""

    def blocked_on(self, worker: int, after: int) -> str:
        raise NotImplementedError

    def answer_fields(self) -> dict:
        return {}

    def add_stats(self, stats: dict) -> None:
        pass


class ArrivalPushes(PushHandler):
    """Each push applied as it arrives, with ``policies.apply_factor`` on its staleness."""

    def on_push(self, worker: int, message: dict) -> None:
        session = self.session
        delay = session.store.staleness(message)
        if message.get("skip"):
            session.stats["skipped"] += 1
        else:
            factor = policies.apply_factor(self.spec, delay, message["factor"])
            session.store.use_hyper(message["use_hyper"])
            session.store.apply(message["grads"], factor)
        session.release(message)
        session.record(worker, delay)

    def blocked_on(self, worker: int, after: int) -> str:
        session = self.session
        behind = [w for w in session.active()
                  if session.pushes[worker] - session.pushes[w] > self.spec.staleness]
        return (f"policy {self.spec.name!r} (staleness {self.spec.staleness}): worker {worker} "
                f"waited {session.timeout_s:.1f} s for workers {behind} to catch up "
                f"(dead or stuck?)")


class RoundPushes(PushHandler):
    """Pushes kept by clock until ``policies.Rounds`` closes their round (BSP, Sync-opt);
    pushes beyond the quorum or for a round already applied are dropped."""

    needs_everyone = True

    def __init__(self, session):
        super().__init__(session)
        self.buffered: Dict[tuple, dict] = {}  # (clock, worker) -> push

    def on_push(self, worker: int, message: dict) -> None:
        session = self.session
        if session.rounds.offer(worker, message["clock"]):
            self.buffered[(message["clock"], worker)] = message
        else:
            session.stats["dropped"] += 1
            session.release(message)

    def close(self) -> None:
        session = self.session
        while not session.incoming and session.rounds.ready(session.active()):
            clock = session.rounds.applied
            kept, late = session.rounds.close()
            session.stats["dropped"] += len(late)
            messages = [self.buffered.pop((clock, w)) for w in kept]
            for w in late:
                session.release(self.buffered.pop((clock, w), {}))
            if any(message.get("skip") for message in messages):
                session.stats["skipped"] += 1
            else:
                total = {}
                for message in messages:
                    for cid, g in message["grads"].items():
                        total[cid] = total[cid] + g if cid in total else g
                session.store.use_hyper(messages[kept.index(min(kept))]["use_hyper"])
                session.store.apply({cid: g / len(messages) for cid, g in total.items()}, 1.0)
            for message, w in zip(messages, kept):
                # The round's update was counted in the versions already.
                session.record(w, max(0, session.store.staleness(message) - 1))
                session.release(message)
            migration.switch_due(session)

    def blocked_on(self, worker: int, after: int) -> str:
        session = self.session
        missing = session.rounds.missing(session.active())
        return (f"policy {self.spec.name!r}: round {session.rounds.applied} still waits for "
                f"workers {missing} after {session.timeout_s:.1f} s (dead or stuck?)")
