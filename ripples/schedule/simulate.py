"""A discrete-event run of workers against a :class:`GroupGenerator`, in emulated time.

Each worker loops: compute a step (its own duration), take the next group (from the groups
it already holds, else by a request to the generator), wait until every member of the group
has arrived at it, spend ``comm_time`` averaging, and start the next step. Groups are taken
in the order the generator handed them out, as real workers do. When a worker stops it
leaves the generator and executes the groups it still holds. If at some point no event can
happen while a worker is still unfinished, the workers wait on each other in a cycle (or
the generator starves them): :class:`DeadlockError`.
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from typing import Callable, Dict, List, Optional

from .base import Assignment
from .generator import GroupGenerator


class DeadlockError(RuntimeError):
    """The simulated workers can make no progress."""


class SimClock:
    """The emulated time, callable as a generator clock."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@dataclasses.dataclass
class SimResult:
    """What a simulated run produced.

    executed: per worker, the ``(seq, group)`` pairs it executed, in execution order.
    steps: per worker, local steps computed.
    makespan: emulated time when the last worker finished.
    """
    executed: Dict[int, List[Assignment]]
    steps: Dict[int, int]
    makespan: float

    @property
    def throughput(self) -> float:
        """Steps per second summed over workers."""
        return sum(self.steps.values()) / self.makespan

    @property
    def groups(self) -> int:
        """Distinct groups executed."""
        return len({seq for pairs in self.executed.values() for seq, _ in pairs})


def simulate(generator: GroupGenerator, clock: SimClock,
             step_time: Callable[[int, int], float],
             stop: Callable[[int, int, float], bool], comm_time: float = 0.0) -> SimResult:
    """Run every worker of ``generator`` (built with ``clock``) until ``stop`` says so.

    Args:
        step_time: ``(worker, step) -> seconds`` of computing that step.
        stop: ``(worker, steps done, now) -> bool``, asked after every step; True makes
            the worker leave and finish the groups it holds.
        comm_time: seconds one group's averaging takes once all members have arrived.
    """
    n = generator.size
    order = itertools.count()
    events: list = []
    held = {w: collections.deque() for w in range(n)}
    executed: Dict[int, List[Assignment]] = {w: [] for w in range(n)}
    steps = {w: 0 for w in range(n)}
    leaving = set()
    done = set()
    arrived: Dict[int, set] = collections.defaultdict(set)
    wake_at: Optional[float] = None

    def push(at, kind, arg):
        heapq.heappush(events, (at, next(order), kind, arg))

    def serve():
        nonlocal wake_at
        for worker, pairs in generator.poll().items():
            held[worker].extend(pairs)
            next_group(worker)
        deadline = generator.next_deadline()
        if deadline is not None and deadline != wake_at:
            wake_at = deadline
            push(max(deadline, clock.now), "wake", None)

    def next_group(worker):
        if not held[worker]:
            if worker in leaving:
                done.add(worker)
            else:
                generator.request(worker)
                serve()
            return
        seq, group = held[worker][0]
        arrived[seq].add(worker)
        if len(arrived[seq]) == len(group):
            del arrived[seq]
            push(clock.now + comm_time, "averaged", (seq, group))

    for w in range(n):
        push(step_time(w, 0), "computed", w)
    while events:
        clock.now, _, kind, arg = heapq.heappop(events)
        if kind == "computed":
            steps[arg] += 1
            if stop(arg, steps[arg], clock.now):
                leaving.add(arg)
                held[arg].extend(generator.leave(arg))
                serve()
            next_group(arg)
        elif kind == "averaged":
            seq, group = arg
            for w in group:
                executed[w].append(held[w].popleft())
                if w in leaving:
                    next_group(w)
                else:
                    push(clock.now + step_time(w, steps[w]), "computed", w)
        else:
            wake_at = None
            serve()
    if len(done) < n:
        stuck = {w: (list(held[w])[:1] or "waiting for the generator")
                 for w in range(n) if w not in done}
        raise DeadlockError(f"no event can happen at t={clock.now:.3f}; unfinished workers "
                            f"and what they wait on: {stuck}")
    return SimResult(executed, steps, clock.now)
