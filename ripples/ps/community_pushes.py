"""The server's side of CASP communities (``policy="casp"``).

A push comes from a community's leader and names its members; it is applied on arrival
and counts as one round for every member. Server 0 keeps the community controller
(``casp.Controller``) and sends the current plan with every answer to a pull, so a leader
learns a new plan at a round boundary.
"""
from __future__ import annotations

import time

from . import casp
from .pushes import ArrivalPushes


class CommunityPushes(ArrivalPushes):
    """Community pushes, applied on arrival; ``controller`` only on server 0."""

    def __init__(self, session):
        super().__init__(session)
        self.bytes_in = {}  # per community ("0,2,3"), what its leaders pushed here
        self.leaving: set = set()  # workers serving their community's last rounds
        # Workers serving rounds before a collective of the script, from their paused round
        # until they train again (``community.CommunityStep.align``).
        self.paused: set = set()
        self.controller = None
        if session.server.index == 0:
            count = casp.controller_count(self.spec.communities)
            self.controller = casp.Controller(session.num_workers, count,
                                              self.spec.regroup_every)

    def on_push(self, worker: int, message: dict) -> None:
        """Count the round for every member, feed the controller (server 0), apply."""
        session = self.session
        members = message["members"]
        key = ",".join(map(str, members))
        self.bytes_in[key] = self.bytes_in.get(key, 0) + message["nbytes"]
        for w in members:
            if w != message["w"]:
                session.pushes[w] += 1
        if self.controller is not None:
            casp.observe(self.controller, message["plan"], members, message["times"],
                         message.get("losses", ()), time.monotonic())
            # Once a worker is leaving, a new plan could put it in a community that would
            # wait for it forever: the communities stay as they are. A paused worker may be
            # in a collective of the script: no plan until it trains again.
            self.leaving.update(message.get("leaving", ()))
            self.paused = casp.paused_after(self.paused, members,
                                            message.get("paused", ()), self.leaving)
            if not session.joined and not self.leaving and not self.paused:
                casp.regroup(self.controller)
        super().on_push(worker, message)

    def answer_fields(self) -> dict:
        if self.controller is None:
            return {}
        return {"plan": (self.controller.version,
                         casp.labels(self.controller.plan, self.session.num_workers))}

    def add_stats(self, stats: dict) -> None:
        stats["bytes_in_per_community"] = self.bytes_in
        if self.controller is not None:
            stats["communities"] = [list(c) for c in self.controller.plan]
            stats["plan_version"] = self.controller.version
            stats["plan_history"] = [(v, [list(c) for c in p])
                                     for v, p in self.controller.history]
            stats["speed_ema_s"] = dict(self.controller.times)
            if self.controller.progress is not None:  # communities="auto": what it measured
                stats["casp_windows"] = [w._asdict() for w in self.controller.progress.results]
