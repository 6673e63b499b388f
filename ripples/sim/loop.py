"""The discrete-event loop every simulated mode runs on: the clock, the event queue, the
workers' compute, the evaluations, and what a run measured.

A mode subclasses :class:`EventLoop`, starts its workers in ``start()``, names its event
handlers in ``handlers()`` and says in ``measure()`` which models the evaluation reads.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
import time
from typing import Callable, Dict, List, Optional, Tuple

from .scenario import Scenario
from .stats import Workers


class DeadlockError(RuntimeError):
    """No event can happen while the run is not over."""


@dataclasses.dataclass
class RunResult:
    """What one simulated run measured.

    curve: ``(time, loss of the averaged model, loss of worker 0, consensus distance)``
        at every evaluation.
    groups, mean_group_size: collectives (or parameter-server updates) completed, and the
        mean number of workers (or gradients) in one.
    """
    scenario: Scenario
    sim_s: float
    steps: List[int]
    ceiling_steps_per_s: float
    time_to_target_s: Optional[float]
    curve: List[tuple]
    groups: int
    mean_group_size: float
    events: int
    wall_s: float

    @property
    def steps_per_s(self) -> float:
        return sum(self.steps) / self.sim_s if self.sim_s > 0 else 0.0

    @property
    def fraction_of_ceiling(self) -> float:
        return self.steps_per_s / self.ceiling_steps_per_s

    @property
    def consensus_distance(self) -> float:
        return self.curve[-1][3] if self.curve else 0.0

    @property
    def final_loss(self) -> float:
        return self.curve[-1][1] if self.curve else float("nan")


@dataclasses.dataclass
class _Crossing:
    """A collective in flight across nodes: the seconds its bytes still need at a whole
    share of its links (``wire_s``, as of ``since``), its cost after them, its end event,
    its share now, and a version that tells its current end event from superseded ones."""
    nodes: tuple
    wire_s: float
    fixed_s: float
    done: tuple
    since: float
    share: float = 1.0
    version: int = 0


class Clock:
    """The simulated time, callable as a clock (the Group Generator reads it)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class EventLoop:
    """Workers computing steps, and events in time order until the horizon or the target."""

    def __init__(self, scenario: Scenario, progress: Optional[Callable[[float], None]]):
        s = self.s = scenario
        n = s.workers
        self.progress = progress
        self.clock = Clock()
        self.speed = s.speed.sampler(n, s.seed)
        self.step_s = s.compute.seconds
        self.update_s = s.compute.update_s
        self.stats = Workers(s.problem, n, seed=s.seed)
        self.events: list = []
        self.order = itertools.count()
        self.steps = [0] * n
        self.last_compute = [0.0] * n
        self.computing = [False] * n
        self.curve: List[tuple] = []
        self.ttt: Optional[float] = None
        self.groups = 0
        self.group_members = 0
        self.count = 0
        # collectives crossing between nodes (``start_collective``), and their keys per node
        self.crossing: Dict[int, _Crossing] = {}
        self.crossing_at: Dict[int, set] = collections.defaultdict(set)
        self.crossing_ids = itertools.count()

    # -- what a mode provides ------------------------------------------------------
    def start(self) -> None:
        """Start every worker."""
        raise NotImplementedError

    def handlers(self) -> Dict[str, Callable]:
        """Event kind -> handler; ``"computed"`` (a worker's step ended) is required."""
        raise NotImplementedError

    def measure(self) -> tuple:
        """``(loss of the averaged model, loss of worker 0, consensus distance)`` now."""
        raise NotImplementedError

    # -- the loop ------------------------------------------------------------------
    def push(self, at: float, kind: str, *args) -> None:
        heapq.heappush(self.events, (at, next(self.order), kind, args))

    def run(self) -> RunResult:
        began = time.perf_counter()
        s = self.s
        self.start()
        handlers = self.handlers_now = {**self.handlers(), "crossed": self.crossed}
        end = s.horizon_s
        while self.events:
            at = self.events[0][0]
            if at > end or (s.stop_at_target and self.ttt is not None):
                break
            _, _, kind, args = heapq.heappop(self.events)
            self.clock.now = at
            handlers[kind](*args)
            self.count += 1
            if self.progress is not None and self.count % 20000 == 0:
                self.progress(at)
        else:
            raise DeadlockError(f"no event can happen at t={self.clock.now:.3f}s "
                                f"(mode {s.mode}, {s.workers} workers)")
        sim_s = self.ttt if s.stop_at_target and self.ttt is not None else end
        self.clock.now = sim_s
        self.evaluate()
        return RunResult(s, sim_s, list(self.steps), s.ceiling_steps_per_s(), self.ttt,
                         self.curve, self.groups,
                         self.group_members / self.groups if self.groups else 0.0,
                         self.count, time.perf_counter() - began)

    # -- workers -------------------------------------------------------------------
    def evaluate_if_due(self, w: int) -> None:
        """Evaluate before worker 0's every ``eval_every``-th step."""
        if w == 0 and self.steps[0] % self.s.eval_every == 0:
            self.evaluate()

    def start_compute(self, w: int) -> None:
        """Worker ``w`` computes one step; the ``"computed"`` event comes when it ends."""
        compute = self.step_s * self.speed.factor(w)
        self.last_compute[w] = compute  # what a gradient all-reduce can overlap; not the update
        self.computing[w] = True
        self.push(self.clock.now + compute + self.update_s, "computed", w)

    def step_ended(self, w: int) -> None:
        """Account for worker ``w``'s finished step (the start of every ``computed``)."""
        self.steps[w] += 1
        self.computing[w] = False

    def start_collective(self, members: tuple, parts: Tuple[float, float], kind: str,
                         *args) -> None:
        """Start a collective among ``members`` whose cost is ``parts``: ``(fixed_s,
        wire_s)`` from the network model; the event ``kind(*args)`` comes when it ends.

        Within one node it takes ``fixed_s + wire_s``. Across nodes its bytes share the
        inter-node link of every node it spans with the other collectives crossing there
        (``Network.link_sharing``): ``"fixed"``, at ``1 / k`` of its own pace throughout,
        ``k`` the most collectives in flight on any of its nodes when it starts (itself
        included), holding the links to its end; ``"fair"``, at ``1 / k`` with ``k``
        revised whenever a collective on its nodes starts or ends, and off the links once
        its bytes have crossed, when it pays ``fixed_s`` (software cost, latencies)."""
        fixed_s, wire_s = parts
        nodes = tuple(sorted(self.s.network.nodes(members))) if len(members) > 1 else ()
        if len(nodes) <= 1:
            self.push(self.clock.now + fixed_s + wire_s, kind, *args)
            return
        key = next(self.crossing_ids)
        crossing = self.crossing[key] = _Crossing(nodes, wire_s, fixed_s, (kind, args),
                                                  self.clock.now)
        for node in nodes:
            self.crossing_at[node].add(key)
        if self.s.network.link_sharing == "fair":
            self._reshare(nodes)
            return
        crossing.share = 1.0 / max(len(self.crossing_at[node]) for node in nodes)
        crossing.version += 1
        self.push(self.clock.now + fixed_s + wire_s / crossing.share, "crossed", key,
                  crossing.version)

    def _reshare(self, nodes: tuple) -> None:
        """Fair sharing: revise the share of every collective crossing at ``nodes``, and
        its end."""
        now = self.clock.now
        for key in sorted(set().union(*(self.crossing_at[node] for node in nodes))):
            c = self.crossing[key]
            c.wire_s = max(c.wire_s - (now - c.since) * c.share, 0.0)
            c.since = now
            c.share = 1.0 / max(len(self.crossing_at[node]) for node in c.nodes)
            c.version += 1
            self.push(now + c.wire_s / c.share, "crossed", key, c.version)

    def crossed(self, key: int, version: int) -> None:
        """A collective's bytes have crossed (unless its share changed since this event
        was due): its links go to the others, and it ends (under fair sharing, after its
        fixed cost)."""
        c = self.crossing.get(key)
        if c is None or c.version != version:
            return
        del self.crossing[key]
        for node in c.nodes:
            self.crossing_at[node].discard(key)
        kind, args = c.done
        if self.s.network.link_sharing == "fair":
            self._reshare(c.nodes)
            if c.fixed_s > 0:
                self.push(self.clock.now + c.fixed_s, kind, *args)
                return
        self.handlers_now[kind](*args)  # ends now, in this event's place in the order

    # -- measurement ---------------------------------------------------------------
    def evaluate(self) -> None:
        average, worker0, distance = self.measure()
        now = self.clock.now
        if self.curve and self.curve[-1][0] == now:
            return
        self.curve.append((now, average, worker0, distance))
        judged = worker0 if self.s.target_on == "worker0" else average
        if self.ttt is None and self.s.target_loss is not None and judged <= self.s.target_loss:
            self.ttt = now
