"""The simulator's task modes ``ps-epsp`` and ``ps-flexrr``: a clock's global batch cut into
micro-batch tasks that can move between workers, under the real task logic of
``sync="ps"`` (``ripples.ps.tasks``).

What runs the real code: a :class:`ripples.ps.tasks.TaskBoard` deals each clock's tasks by
the current shares (EPSP rebalances them by measured speed once every worker is measured,
then every ``rebalance_every`` clocks), :func:`~ripples.ps.tasks.claim` hands a worker its own tasks,
:func:`~ripples.ps.tasks.steal` moves a task from a projected straggler (EPSP) or from the
worker with the most unclaimed tasks (FlexRR-lite) to a worker that would block, and
:func:`~ripples.ps.tasks.complete` accounts for every task exactly once (it raises on a
task pushed twice). Pulls wait on :func:`~ripples.ps.policies.pull_ready` (clock ``c + 1``
starts once round ``c - staleness`` is applied).

The model, beside :mod:`.ps`'s links and servers:

* a task is ``workers / tasks_per_clock`` of a step: it takes that fraction of the
  worker's step time, and its gradient is taken on that fraction of the batch (at least
  one sample), at the parameters the worker last pulled; steps are counted the same way,
  so throughput and the ceiling stay in steps;
* a worker claims its own tasks one at a time at no cost (the real sampler claims ahead in
  batches to hide the round trip); a steal costs a round trip of the inter-node latency
  before the task starts, as the real pioneer's request does when it has nothing in hand;
* the speed factor is drawn once per worker per clock (a transient slowdown lasts a clock,
  as it lasts a step in the other modes) and also times the tasks it steals;
* when a worker has neither own tasks nor a move, it pushes one message per clock it
  holds gradients of (each a whole-model transfer), advances its clock and pulls; a round
  is applied, as the mean over its tasks, once all of them arrived, rounds in order.
"""
from __future__ import annotations

import collections
from typing import Dict, List

import numpy as np

from ..ps import tasks
from ..ps.policies import pull_ready
from .ps import ParameterServerRun
from .scenario import Scenario


class TaskRun(ParameterServerRun):
    """One ``ps-epsp`` or ``ps-flexrr`` run; see the module docstring."""

    def __init__(self, scenario: Scenario, progress):
        super().__init__(scenario, progress)
        n, spec = scenario.workers, self.spec
        self.board = tasks.TaskBoard(
            n, spec.tasks_per_clock, spec.staleness, spec.rebalance_every,
            rule="projection" if self.policy == "epsp" else "most_remaining")
        self.task_fraction = n / spec.tasks_per_clock
        self.micro_batch = max(1, round(scenario.problem.batch * self.task_fraction))
        self.clock_of = [0] * n
        self.factor = [1.0] * n
        self.own_left = [True] * n
        self.sums: List[Dict[int, np.ndarray]] = [{} for _ in range(n)]
        self.ids: List[Dict[int, List[int]]] = [collections.defaultdict(list) for _ in range(n)]
        self.parts: Dict[int, dict] = {}  # clock -> {"sum", "count"} at the servers
        self.applied = 0
        # clock a pull waits to start -> the workers asking: few keys (at most staleness + 2)
        self.waiting: Dict[int, List[int]] = collections.defaultdict(list)

    def start(self) -> None:
        for w in range(self.s.workers):
            self.begin_clock(w)

    def handlers(self) -> dict:
        return {"computed": self.computed, "pushed": self.pushed, "pulled": self.pulled}

    # -- workers -------------------------------------------------------------------
    def begin_clock(self, w: int) -> None:
        if w == 0 and self.clock_of[0] % self.s.eval_every == 0:
            self.evaluate()
        self.factor[w] = self.speed.factor(w)
        self.own_left[w] = True
        self.next_task(w)

    def next_task(self, w: int) -> None:
        """Start ``w``'s next own task, else a moved one, else end its clock."""
        clock = self.clock_of[w]
        if self.own_left[w]:
            granted = tasks.claim(self.board, w, clock)
            if granted:
                self.compute(w, granted[0], self.clock.now)
                return
            self.own_left[w] = False
        moved = tasks.steal(self.board, w, clock, self.applied)
        if moved is not None:
            self.compute(w, moved, self.clock.now + 2 * self.s.network.inter.latency_s)
            return
        self.end_clock(w)

    def compute(self, w: int, task: tasks.Task, start: float) -> None:
        seconds = self.step_s * self.task_fraction * self.factor[w]
        self.computing[w] = True
        self.push(start + seconds, "computed", w, task, seconds)

    def computed(self, w: int, task: tasks.Task, seconds: float) -> None:
        self.computing[w] = False
        self.steps[w] += self.task_fraction
        self.last_compute[w] = seconds
        tasks.observe(self.board, w, seconds)
        clock, j = task
        gradient = self.stats.gradient(w, self.micro_batch)
        held = self.sums[w]
        held[clock] = gradient if clock not in held else held[clock] + gradient
        self.ids[w][clock].append(j)
        self.next_task(w)

    def end_clock(self, w: int) -> None:
        for clock in sorted(self.ids[w]):
            self.push(self.transfer(self.links_in), "pushed", w, clock,
                      self.sums[w].pop(clock), self.ids[w][clock])
        self.ids[w].clear()
        self.clock_of[w] += 1
        self.waiting[self.clock_of[w]].append(w)
        self.answer_pulls()

    # -- servers -------------------------------------------------------------------
    def pushed(self, w: int, clock: int, gradient_sum: np.ndarray, ids: List[int]) -> None:
        tasks.complete(self.board, w, clock, ids)
        part = self.parts.setdefault(clock, {"sum": 0.0, "count": 0})
        part["sum"] = part["sum"] + gradient_sum
        part["count"] += len(ids)
        self.count_push(w)
        total = self.spec.tasks_per_clock
        while self.parts.get(self.applied, {}).get("count") == total:
            part = self.parts.pop(self.applied)
            self.apply([part["sum"] / total], 1.0, total)
            self.applied += 1
        self.answer_pulls()

    def answer_pulls(self) -> None:
        for clock in [c for c in self.waiting if pull_ready(self.spec, c, self.applied, 0, ())]:
            for w in self.waiting.pop(clock):
                self.push(self.transfer(self.links_out), "pulled", w,
                          self.server.params.copy(), self.server.version)

    def pulled(self, w: int, params: np.ndarray, version: int) -> None:
        self.stats.params[w] = params
        self.computed_on[w] = version
        self.begin_clock(w)
