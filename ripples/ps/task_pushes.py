"""The server's side of EPSP and FlexRR-lite tasks (``policy="epsp"``/``"flexrr"``).

Server 0 keeps the ``tasks.TaskBoard`` and answers ``task`` requests (claims of ``count``
tasks, and steals) with the tasks granted and how many of the worker's own share are still
unclaimed. A push carries the summed gradients of the tasks a worker computed for one clock
and their ids; a clock's round is applied, as the sum over the clock's tasks divided by
their number, once all of them have arrived, in clock order. A task pushed twice fails the
session (every server checks; server 0 also checks that the pusher claimed it).
"""
from __future__ import annotations

from typing import Dict

from . import tasks
from .pushes import PushHandler


class TaskPushes(PushHandler):
    """Task pushes summed per clock; ``board`` only on server 0."""

    needs_everyone = True

    def __init__(self, session):
        super().__init__(session)
        self.applied = 0  # tasks applied
        self.clock_parts: Dict[int, dict] = {}
        self.board = None
        if session.server.index == 0:
            self.board = tasks.TaskBoard(
                session.num_workers, self.spec.tasks_per_clock, self.spec.staleness,
                self.spec.rebalance_every,
                rule="projection" if self.spec.name == "epsp" else "most_remaining")

    def on_task_request(self, worker: int, message: dict) -> None:
        if self.board is None:
            super().on_task_request(worker, message)
        session = self.session
        if message.get("task_s") is not None:
            tasks.observe(self.board, worker, message["task_s"])
        clock = message["clock"]
        if message["steal"]:
            task = tasks.steal(self.board, worker, clock, session.rounds.applied,
                               message.get("ahead", 0))
            granted = [] if task is None else [task]
        else:
            granted = tasks.claim(self.board, worker, clock, message.get("count", 1))
        session.server.reply(worker, {"rid": message["rid"], "tasks": granted,
                                      "left": tasks.unclaimed(self.board, worker, clock),
                                      "rounds": session.rounds.applied}, session.delay_s)

    def on_push(self, worker: int, message: dict) -> None:
        """Add one worker's summed task gradients to its clock; apply complete clocks."""
        session = self.session
        clock, ids = message["clock"], message["tasks"]
        if clock < session.rounds.applied:
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
        session.release(message)
        session.record(worker, session.store.staleness(message))
        self.close_clocks()

    def close_clocks(self) -> None:
        session = self.session
        total = self.spec.tasks_per_clock
        while len(self.clock_parts.get(session.rounds.applied, {}).get("ids", ())) == total:
            part = self.clock_parts.pop(session.rounds.applied)
            if part["skip"]:
                session.stats["skipped"] += 1
            else:
                session.store.use_hyper(part["hyper"])
                session.store.apply({cid: g / total for cid, g in part["grads"].items()}, 1.0)
            self.applied += total
            session.rounds.applied += 1

    def blocked_on(self, worker: int, after: int) -> str:
        session = self.session
        have = len(self.clock_parts.get(session.rounds.applied, {}).get("ids", ()))
        return (f"policy {self.spec.name!r}: clock {session.rounds.applied} has "
                f"{have} of {self.spec.tasks_per_clock} tasks after {session.timeout_s:.1f} s "
                f"(a worker dead or stuck?)")

    def add_stats(self, stats: dict) -> None:
        stats["tasks_applied"] = self.applied
        if self.board is not None:
            stats["tasks"] = {key: (list(value) if isinstance(value, list) else value)
                              for key, value in self.board.stats.items()}
            stats["task_time_ema_s"] = dict(self.board.task_time)
            stats["task_accounting"] = {
                c: {"claimed": dict(t.claimed), "done": sorted(t.done)}
                for c, t in self.board.clocks.items()}
