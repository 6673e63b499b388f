"""The workers' side of PSLD (``ripples.ps.psld`` decides, this measures and acts).

Every worker times, per iteration, each server's answer: from the start of its push to
the arrival of that server's pull answer. It piggybacks its last times on its next pushes
(``"prof"``); servers keep each worker's latest and return them with their answers to
worker 0. Worker 0 runs the scheduler on the median over workers at the end of every
step (an iteration boundary) and announces a new map to every server with a ``remap``
message (see ``ripples.ps.migration``); it announces no other until it has itself adopted
that map, and measurements restart under every new map.
"""
from __future__ import annotations

import statistics
import time
from typing import Dict, Optional

from . import psld


class Balancer:
    """PSLD for one ``PSOptimizer``: ``link`` is its ``worker_link.ServerLink``, ``mover``
    its ``chunk_moves.ChunkMover``; ``config`` is a ``psld.PSLDConfig``."""

    def __init__(self, link, mover, config: psld.PSLDConfig):
        self.link = link
        self.mover = mover
        self.state = psld.new_state(config)
        self.push_began: Optional[float] = None
        self.last_times: Dict[int, float] = {}
        self.last_boundary: Optional[float] = None
        self.skip = 0
        self.stats = {"migrations": 0, "chunks_moved": 0, "bytes_moved": 0, "decisions": [],
                      "times_log": []}

    def profile(self) -> Dict[int, float]:
        """What this worker piggybacks on its pushes: its last per-server times."""
        return self.last_times

    def pushing(self) -> None:
        self.push_began = time.monotonic()

    def pulled(self, answers: Dict[int, dict]) -> None:
        """Record this iteration's per-server times from the pull ``answers``."""
        if self.push_began is None:
            return
        self.last_times = {s: a["_arrived"] - self.push_began for s, a in answers.items()
                           if "_arrived" in a}
        self.push_began = None

    def boundary(self) -> None:
        """End of a step: worker 0 feeds the scheduler and announces its decision."""
        link = self.link
        now = time.monotonic()
        previous, self.last_boundary = self.last_boundary, now
        if link.worker != 0 or previous is None:
            return
        if link.map.version != self.mover.announced_version:
            return  # the announced map is not in use yet
        if self.skip:  # the profiles of the first iterations under a new map are older
            self.skip -= 1
            return
        times = self.median_times(link.last_profiles)
        if not times:
            return
        self.stats["times_log"].append((link.clock, now - previous, times))
        sizes = [c.nbytes for c in link.map.chunks]
        decision = psld.observe(self.state, now - previous, times, sizes, link.map.owners,
                                link.map.members, link.map.num_servers)
        if decision is not None and tuple(decision.owners) != tuple(link.map.owners):
            self.announce(decision, sizes)

    def median_times(self, profiles: Dict[int, Dict[int, float]]) -> Dict[int, float]:
        members = self.link.map.members
        out = {}
        for server in members:
            seen = [p[server] for p in profiles.values() if server in p]
            if seen:
                out[server] = statistics.median(seen)
        return out if len(out) == len(members) else {}

    def announce(self, decision: psld.Decision, sizes) -> None:
        owners = self.link.map.owners
        moved = [cid for cid, (a, b) in enumerate(zip(owners, decision.owners)) if a != b]
        version = self.mover.move(decision.owners, decision.active)
        self.stats["migrations"] += 1
        self.stats["chunks_moved"] += len(moved)
        self.stats["bytes_moved"] += sum(sizes[cid] for cid in moved)
        self.stats["decisions"].append({"clock": self.link.clock, "kind": decision.kind,
                                        "version": version, "chunks": moved,
                                        "active": list(decision.active)})

    def map_changed(self) -> None:
        psld.reset_window(self.state)
        self.skip = 2

    def summary(self) -> dict:
        return {"migrations": self.stats["migrations"], "chunks_moved": self.stats["chunks_moved"],
                "bytes_moved": self.stats["bytes_moved"],
                "rollbacks": self.state.counts["rollback"],
                "explorations": self.state.counts["explore"], "counts": dict(self.state.counts),
                "decisions": list(self.stats["decisions"])}
