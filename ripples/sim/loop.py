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
from typing import Callable, Dict, List, Optional

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
        self.node_flows = collections.Counter()  # multi-node transfers in flight per node

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
        handlers = self.handlers()
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
        t = self.step_s * self.speed.factor(w)
        self.last_compute[w] = t
        self.computing[w] = True
        self.push(self.clock.now + t, "computed", w)

    def step_ended(self, w: int) -> None:
        """Account for worker ``w``'s finished step (the start of every ``computed``)."""
        self.steps[w] += 1
        self.computing[w] = False

    def occupy_links(self, members: tuple) -> tuple:
        """The nodes a transfer among ``members`` spans, and the share of their inter-node
        links it gets; counts it on those links when it spans several nodes."""
        nodes = self.s.network.nodes(members) if len(members) > 1 else ()
        if len(nodes) <= 1:
            return (), 1
        sharing = 1 + max(self.node_flows[node] for node in nodes)
        for node in nodes:
            self.node_flows[node] += 1
        return tuple(nodes), sharing

    def release_links(self, nodes: tuple) -> None:
        for node in nodes:
            self.node_flows[node] -= 1

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
