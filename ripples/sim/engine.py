"""The discrete-event engine: simulated workers computing, meeting in groups, averaging.

Each worker loops: compute a step (compute model x speed model), then execute the groups
of that step in order (per-step schedules: all its groups of the step; generator: the
next group it holds, asking the generator over the network when it holds none). A group
starts when its last member arrives and lasts the network's cost of its collective; its
averaging is applied to the members' real parameter vectors (:mod:`.stats`) when it
ends. Time is the simulator's: the Group Generator reads it as its clock.

Asynchronous AD-PSGD (mode ``"adpsgd"``) has no groups to meet in: an active worker, after
each step, draws its partner with :func:`ripples.schedule.adpsgd.adpsgd_partner` (as real
ranks do) and waits for one exchange with it; a passive worker never stops computing, and
serves the exchanges that reach it one at a time, in arrival order, as its responder
thread does. The averaging is applied when the exchange ends.
"""
from __future__ import annotations

import collections
from typing import Callable, Dict, List, Optional

import numpy as np

from ..schedule.adpsgd import adpsgd_partner, is_active
from ..schedule.base import Assignment
from .loop import DeadlockError, EventLoop, RunResult  # noqa: F401 (DeadlockError: re-exported)
from .ps import ParameterServerRun
from .ps_eager import EagerRun
from .ps_tasks import TaskRun
from .scenario import LOCKSTEP_MODES, PS_MODES, Scenario
from .sources import PerStep, make_generator
from .workers import Blocks

REQUEST_BYTES = 64  # a pickled (op, rank, id) request or a small answer
MAX_EARLY_EXIT = 0.9  # of a collective's duration


def simulate(scenario: Scenario, progress: Optional[Callable[[float], None]] = None) -> RunResult:
    """Run ``scenario`` and return its measurements. ``progress(now)`` is called now and
    then with the simulated time (for a progress bar)."""
    if scenario.mode in ("ps-epsp", "ps-flexrr"):
        return TaskRun(scenario, progress).run()
    if scenario.mode == "ps-eager":
        return EagerRun(scenario, progress).run()
    if scenario.mode in PS_MODES:
        return ParameterServerRun(scenario, progress).run()
    return _Run(scenario, progress).run()


class _Run(EventLoop):
    """The decentralized modes and all-reduce."""

    def __init__(self, scenario: Scenario, progress):
        super().__init__(scenario, progress)
        s = scenario
        n = s.workers
        self.gradient_mode = s.mode == "allreduce"
        self.asynchronous = s.mode == "adpsgd"
        self.generator = (make_generator(s, self.clock) if s.mode.startswith("generator")
                          else None)
        self.per_step = None if self.generator or self.asynchronous else PerStep(s)
        self.barrier = s.barrier_every if s.mode in LOCKSTEP_MODES else 0
        self.todo = [collections.deque() for _ in range(n)]
        self.held = [collections.deque() for _ in range(n)]  # generator groups not yet due
        self.exchanges = [0] * n  # AD-PSGD exchanges each active worker has started
        self.responder = [collections.deque() for _ in range(n)]  # active workers queued at a passive one
        self.arrived: Dict[int, int] = collections.defaultdict(int)
        self.at_barrier: Dict[int, int] = collections.defaultdict(int)
        self.wake_at = None
        self._service_spread = Blocks(np.random.default_rng([s.seed, 13]).standard_normal)
        self._exit_draws = Blocks(np.random.default_rng([s.seed, 17]).standard_exponential)
        self.exits: Dict[int, tuple] = {}  # seq -> (start, each member's early exit share)

    def start(self) -> None:
        for w in range(self.s.workers):
            self.begin_step(w)

    def handlers(self) -> dict:
        return {"computed": self.computed, "averaged": self.averaged,
                "barrier": self.barrier_done, "request": self.request_arrives,
                "answer": self.answer_arrives, "wake": self.wake, "exchanged": self.exchanged,
                "left": self.left}

    # -- workers -------------------------------------------------------------------
    def begin_step(self, w: int) -> None:
        step = self.steps[w]
        self.evaluate_if_due(w)
        if self.barrier and step and step % self.barrier == 0:
            self.at_barrier[step] += 1
            if self.at_barrier[step] == self.s.workers:
                del self.at_barrier[step]
                cost = self.s.network.allreduce_s(8, self.s.workers,
                                                  len(self.s.network.nodes(range(self.s.workers))))
                self.push(self.clock.now + cost, "barrier", step)
            return
        self.start_compute(w)

    def barrier_done(self, step: int) -> None:
        for w in range(self.s.workers):
            self.start_compute(w)

    def computed(self, w: int) -> None:
        self.step_ended(w)
        self.stats.step_done(w)
        if self.asynchronous:
            self.exchange_or_step(w)
        elif self.generator is None:
            self.todo[w].extend(self.per_step.groups(w, self.steps[w] - 1))
            self.proceed(w)
        elif self.held[w]:
            self.todo[w].append(self.held[w].popleft())
            self.proceed(w)
        else:
            delay = self.s.network.message_s(REQUEST_BYTES, w, 0) + self.service_cost()
            if delay > 0:
                self.push(self.clock.now + delay, "request", w)
            else:
                self.request_arrives(w)

    def service_cost(self) -> float:
        """One request's software cost at the Group Generator service (``Network``)."""
        network = self.s.network
        if not network.service_jitter:
            return network.service_s
        return network.service_s * float(np.exp(network.service_jitter *
                                                self._service_spread.next()))

    def proceed(self, w: int) -> None:
        """Arrive at the next group of this step, or start the next step."""
        if not self.todo[w]:
            self.begin_step(w)
            return
        seq, group = self.todo[w][0]
        self.arrived[seq] += 1
        if self.arrived[seq] == len(group):
            del self.arrived[seq]
            self.start_group(seq, group, w)

    def start_group(self, seq: int, group: tuple, last: int) -> None:
        network = self.s.network
        fixed, wire = network.allreduce_parts(self.s.model_bytes, len(group),
                                               max(len(network.nodes(group)), 1))
        if self.gradient_mode and self.s.overlap:  # hidden behind the backward pass
            hidden = self.s.overlap * self.last_compute[last]
            fixed, wire = max(fixed - max(hidden - wire, 0.0), 0.0), max(wire - hidden, 0.0)
        early = self.early_exits(len(group))
        if early is not None:  # the collective's end event is its first member's exit
            self.exits[seq] = (self.clock.now, early)
            fixed, wire = fixed * (1 - max(early)), wire * (1 - max(early))
        self.start_collective(group, (fixed, wire), "averaged", seq, group)

    def early_exits(self, members: int) -> Optional[List[float]]:
        """How long before the last member each member leaves a collective, as shares of
        its duration (``Network.exit_early``), or None: all together."""
        mean = self.s.network.exit_early
        if not mean or members < 2:
            return None
        draws = [mean * self._exit_draws.next() for _ in range(members)]
        # capped so that the first member's exit stays after the start
        return [min(x - min(draws), MAX_EARLY_EXIT) for x in draws]

    def averaged(self, seq: int, group: tuple) -> None:
        if self.gradient_mode:
            self.stats.average_gradients(group)
        else:
            self.stats.average_parameters(group)
        self.groups += 1
        self.group_members += len(group)
        if seq not in self.exits:
            for w in group:
                self.left(w)
            return
        start, early = self.exits.pop(seq)
        first = max(early)
        duration = (self.clock.now - start) / (1 - first)  # to the last member
        for w, share in zip(group, early):
            later = duration * (first - share)
            if later > 0:
                self.push(self.clock.now + later, "left", w)
            else:
                self.left(w)

    def left(self, w: int) -> None:
        """``w`` left the collective at the head of its to-do list."""
        self.todo[w].popleft()
        self.proceed(w)

    # -- asynchronous AD-PSGD -----------------------------------------------------
    def exchange_or_step(self, w: int) -> None:
        partner = (adpsgd_partner(self.s.seed, w, self.exchanges[w], self.s.workers)
                   if is_active(w) else None)
        if partner is None:  # a passive worker, or no passive worker to pair with
            self.begin_step(w)
            return
        self.exchanges[w] += 1
        self.responder[partner].append(w)
        if len(self.responder[partner]) == 1:
            self.start_exchange(partner)

    def start_exchange(self, passive: int) -> None:
        active = self.responder[passive][0]
        pair = (active, passive)
        parts = self.s.network.exchange_parts(self.s.model_bytes,
                                              len(self.s.network.nodes(pair)))
        self.start_collective(pair, parts, "exchanged", active, passive)

    def exchanged(self, active: int, passive: int) -> None:
        self.stats.average_parameters((active, passive),
                                      computing=(passive,) if self.computing[passive] else ())
        self.groups += 1
        self.group_members += 2
        self.responder[passive].popleft()
        if self.responder[passive]:
            self.start_exchange(passive)
        self.begin_step(active)

    # -- the generator -------------------------------------------------------------
    def request_arrives(self, w: int) -> None:
        self.generator.request(w)
        self.serve()

    def serve(self) -> None:
        for w, pairs in self.generator.poll().items():
            delay = self.s.network.message_s(REQUEST_BYTES, 0, w)
            if delay > 0:
                self.push(self.clock.now + delay, "answer", w, pairs)
            else:
                self.answer_arrives(w, pairs)
        deadline = self.generator.next_deadline()
        if deadline is not None and deadline != self.wake_at:
            self.wake_at = deadline
            self.push(max(deadline, self.clock.now), "wake")

    def wake(self) -> None:
        self.wake_at = None
        self.serve()

    def answer_arrives(self, w: int, pairs: List[Assignment]) -> None:
        self.held[w].extend(pairs)
        self.todo[w].append(self.held[w].popleft())
        self.proceed(w)

    # -- measurement ---------------------------------------------------------------
    def measure(self) -> tuple:
        if not self.gradient_mode:
            self.stats.flush()
        return self.stats.loss(), self.stats.loss(0), self.stats.consensus_distance()
