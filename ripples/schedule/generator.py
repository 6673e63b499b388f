"""The Group Generator's state: Group Buffer plus Group Division, with no communication.

The service (``service.py``) and the simulator (``simulate.py``) drive the same object:
``request(w)`` records that worker ``w`` asks for groups, ``poll()`` returns the answers that
are due (worker -> list of ``(seq, group)``), ``next_deadline()`` says when ``poll()`` must be
called again even if nothing arrives, and ``leave(w)`` removes a worker.

Group Buffer: every worker has a FIFO of groups assigned to it and not yet handed out. A
new group is appended to the FIFO of every member; a request pops (up to ``batch`` groups
from) the head of the requester's FIFO and only triggers a division when it is empty.

Group Division partitions a set of workers into disjoint groups of ``group_size`` at once
(a trailing group of one joins the previous group), repeated ``batch`` times, every group
numbered by one global counter. Which workers are divided is the policy:

* ``"all"``: every active worker, as soon as a requester's FIFO is empty. A slow worker is
  then in every division and its group-mates wait for it.
* ``"ready"``: only the workers with an outstanding request (ready). When a worker becomes
  ready it may wait a window of ``window_fraction`` times its own request interval (EMA,
  capped by ``max_wait_s``; ``first_wait_s`` before an interval is known) for other workers.
  The division runs as soon as the window of some ready worker has expired, or earlier when
  no other present worker is expected (last request + its interval EMA) before that. So
  workers of similar speed meet, a slow worker waits briefly for fast ones (its window is
  long) and fast workers never wait for a slow one (its expected arrival is far away). A
  ready worker alone gets a group of itself only if it has been alone fewer than
  ``max_isolation`` divisions in a row; otherwise it waits for the next worker to become
  ready, which bounds how far its model drifts, but only while some other worker may come:
  at most ``company_wait_s``, and not at all when every other worker is away or overdue.

Presence: the generator never waits for a worker that cannot come. A worker is *away* from
``away(w)`` (it told the generator that it left the training step: it is in a collective of
the script, evaluating, done with its share of the epoch) until its next request, and
*overdue* once ``OVERDUE_INTERVALS`` of its own request intervals have passed since its last
request without a new one (it is doing something the generator was not told of, such as
evaluation or a checkpoint, or it is stuck). Neither kind is waited for, by a window or for
company. ``"all"`` ignores presence: it divides every active worker, as its buffered
groups must be executed in the same order everywhere (two generators side by side, a GAN's
two optimizers, rely on it). A worker whose speed is
not known yet (fewer than two requests) may come at any moment and is waited for, within
the bounds above.

Topology (``ranks_per_node``, optional): a division first groups the workers of each node
among themselves (fast links), and only every ``cross_node_every``-th division is divided
across nodes. A topology-blind division of P workers on nodes of r puts nearly every group
across nodes, so every P-Reduce crosses the slowest link; most groups of a node-aware
division stay on a node, while the cross-node divisions still mix every model with every
other (as Prague's static schedule alternates intra- and inter-node groups). A worker that
is ready alone on its node in the other divisions gets a group of itself, as a lone ready
worker does, while it has been alone fewer than ``max_isolation`` divisions in a row;
after that it is divided across nodes with the others so left alone. Ready workers arrive
one by one, so a division often finds one worker of a node ready: dividing those across
nodes made most groups cross the slow link after all (4 emulated hosts x 2 ranks at 1
Gbit/s, 20 MB model: 23.6-26.6 steps/s, against 36.9-37.8 with the lone step).
"""
from __future__ import annotations

import collections
import dataclasses
import heapq
import math
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence

import numpy as np

from .base import (POLICIES, Assignment, Group, check_choice, check_group_size, check_int)

# A worker that has not asked for this many of its own request intervals is doing something
# else (evaluation, a checkpoint, a collective of the script): 1 would call every step a
# little slower than average overdue; at 2 a step must take twice the usual time.
OVERDUE_INTERVALS = 2.0
# Why a division ran: policy "all"; every present worker was ready; a ready worker's window
# ended; no other worker was expected before the earliest window ends.
DIVISION_REASONS = ("all", "everyone ready", "window ended", "nobody expected sooner")
# The most recent requests and divisions kept in GroupGenerator.events (about 1 MB).
EVENTS_KEPT = 10_000


@dataclasses.dataclass
class _Worker:
    fifo: Deque[Assignment] = dataclasses.field(default_factory=collections.deque)
    active: bool = True
    away: bool = False  # told the generator it left the training step; back at its request
    waiting_since: Optional[float] = None  # outstanding request, None if none
    last_request: Optional[float] = None
    interval_ema: Optional[float] = None
    lone_rounds: int = 0  # divisions in a row in which it got a group of itself
    # Bookkeeping of the "others" (active, not ready) index; see GroupGenerator._enter_others.
    in_others: bool = True
    unknown: bool = True  # counted among the others whose next request time is unknown
    version: int = 0  # entries of the expected-arrival heap with another version are stale


def divide(order: Sequence[int], group_size: int) -> List[Group]:
    """Cut ``order`` into consecutive groups of ``group_size``; a trailing group of one
    worker joins the previous group (nobody is left alone unless alone overall)."""
    groups = [list(order[i:i + group_size]) for i in range(0, len(order), group_size)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return [tuple(sorted(g)) for g in groups]


def divide_by_node(members: Sequence[int], ranks_per_node: int, group_size: int,
                   shuffle: Callable[[Sequence[int]], List[int]],
                   cross: bool, may_stay_alone: Callable[[int], bool] = lambda w: False
                   ) -> List[Group]:
    """Groups within each node (``divide`` of the node's ``shuffle``d members). With
    ``cross``, the first shuffled member of every node is its representative instead: the
    representatives are divided across nodes, so each node's link carries one group. Workers
    left alone on their node are divided across nodes together, except, outside ``cross``
    divisions, those for which ``may_stay_alone(w)``: each gets a group of itself."""
    by_node: Dict[int, List[int]] = {}
    for w in members:
        by_node.setdefault(w // ranks_per_node, []).append(w)
    groups: List[Group] = []
    across: List[int] = []
    for node in sorted(by_node):
        order = shuffle(by_node[node])
        if cross and len(by_node) > 1:
            across.append(order.pop(0))
        for group in divide(order, group_size):
            if len(group) > 1 or (not cross and may_stay_alone(group[0])):
                groups.append(group)
            else:
                across.extend(group)
    if across:
        groups.extend(divide(shuffle(across), group_size))
    return groups


class GroupGenerator:
    """Group Buffer + Group Division for ``size`` workers (see the module docstring).

    Args:
        size: number of workers (ranks ``0..size-1``).
        group_size: target size ``k`` of a group, ``1 <= k <= size``.
        seed: seed of the random divisions.
        policy: ``"ready"`` or ``"all"``.
        batch: groups handed out per request (and divisions made at once), >= 1.
        max_isolation: divisions in a row a worker may be alone before it must wait for
            company (``"ready"`` only), >= 0.
        company_wait_s: the longest such a wait for company lasts, > 0.
        window_fraction, max_wait_s, first_wait_s: the wait window of ``"ready"``. The
            default 0.1 was chosen in simulation (8 workers, 50 ms steps, each step 5x slow
            with p = 0.1): 0.5 reached 72% of the throughput ceiling with groups of 3.6 on
            average, 0.1 reached 90% with groups of 2.9.
        ema_alpha: weight of the newest request interval in the speed EMA, in (0, 1].
        ranks_per_node: workers per node (ranks ``n*r .. n*r+r-1`` on node ``n``), or None
            for topology-blind divisions.
        cross_node_every: with ``ranks_per_node``, every this-many-th division ignores the
            nodes, >= 1 (1: always, as topology-blind).
        clock: time source in seconds (``time.monotonic``; a simulator passes its own).
    """

    def __init__(self, size: int, group_size: int, seed: int = 0, policy: str = "ready",
                 batch: int = 1, max_isolation: int = 2, window_fraction: float = 0.1,
                 max_wait_s: float = 1.0, first_wait_s: float = 0.2, ema_alpha: float = 0.3,
                 company_wait_s: float = 1.0, ranks_per_node: Optional[int] = None,
                 cross_node_every: int = 4, clock: Callable[[], float] = time.monotonic):
        check_int("size", size, low=1)
        check_group_size(group_size, size)
        check_int("seed", seed, low=0)
        check_choice("policy", policy, POLICIES)
        check_int("batch", batch, low=1)
        check_int("max_isolation", max_isolation, low=0)
        for name, value in (("window_fraction", window_fraction), ("max_wait_s", max_wait_s),
                            ("first_wait_s", first_wait_s)):
            if not value >= 0:
                raise ValueError(f"{name} must be a number >= 0, got {value!r}")
        if not 0 < ema_alpha <= 1:
            raise ValueError(f"ema_alpha must be in (0, 1], got {ema_alpha!r}")
        if not company_wait_s > 0:
            raise ValueError(f"company_wait_s must be a number > 0, got {company_wait_s!r}")
        if ranks_per_node is not None:
            check_int("ranks_per_node", ranks_per_node, low=1)
        check_int("cross_node_every", cross_node_every, low=1)
        self.size = size
        self.group_size = group_size
        self.policy = policy
        self.batch = batch
        self.max_isolation = max_isolation
        self.window_fraction = window_fraction
        self.max_wait_s = max_wait_s
        self.first_wait_s = first_wait_s
        self.ema_alpha = ema_alpha
        self.company_wait_s = company_wait_s
        self.ranks_per_node = ranks_per_node
        self.cross_node_every = cross_node_every
        self._clock = clock
        self._rng = np.random.default_rng(seed)
        self._workers = [_Worker() for _ in range(size)]
        self._next_seq = 0
        self.divisions = 0
        # Why the divisions ran (DIVISION_REASONS), and how many ready workers they divided
        self.division_reasons: collections.Counter = collections.Counter()
        self.divided_by_reason: collections.Counter = collections.Counter()
        # The latest EVENTS_KEPT events: ("request", time, worker) and ("division", time,
        # reason, groups), to compare how workers arrive here and in a simulation
        self.events: Deque[tuple] = collections.deque(maxlen=EVENTS_KEPT)
        # Every structure below is kept up to date event by event, so a request costs O(k)
        # (plus O(log P) heap work), never a scan of all P workers: at 1,024 workers asking
        # every 100 ms a scan per request is P^2 = 10^7 visits a second.
        self._present_count = size  # active and not away
        self._ready: Dict[int, None] = {}  # workers waiting with an empty FIFO
        self._ready_deadline = math.inf  # min of _deadline() over the ready workers
        self._touched: set = set()  # workers whose answer may be due at the next poll()
        self._unknown_others = size  # others whose next request time is unknown
        self._expected: list = []  # heap (expected request time, version, worker) of others

    # -- queries -------------------------------------------------------------------
    @property
    def active(self) -> List[int]:
        """Workers that have not left."""
        return [w for w, s in enumerate(self._workers) if s.active]

    @property
    def present(self) -> List[int]:
        """Active workers that are not away."""
        return [w for w, s in enumerate(self._workers) if s.active and not s.away]

    def speed_estimate(self, worker: int) -> Optional[float]:
        """The EMA of ``worker``'s request interval in seconds, None before two requests."""
        return self._workers[self._check_worker(worker)].interval_ema

    def next_deadline(self) -> Optional[float]:
        """The time at which ``poll()`` may have something new to answer without any new
        request, or None if only a request or a leave can change anything."""
        if not self._ready or self.policy == "all":
            return None
        if len(self._ready) == 1:
            (only,) = self._ready
            if self._must_have_company(only):
                # Re-examined when the company it waits for becomes overdue.
                return min(self._workers[only].waiting_since + self.company_wait_s,
                           self._next_overdue())
        return self._ready_deadline

    # -- events --------------------------------------------------------------------
    def request(self, worker: int) -> None:
        """Record that ``worker`` asks for groups; the answer comes from ``poll()``."""
        state = self._workers[self._check_worker(worker)]
        if not state.active:
            raise ValueError(f"worker {worker} has left the group generator and cannot request")
        if state.waiting_since is not None:
            raise ValueError(f"worker {worker} already has an outstanding request")
        now = self._clock()
        self._leave_others(worker)
        if state.away:
            state.away = False
            self._present_count += 1
        if state.last_request is not None:
            interval = now - state.last_request
            state.interval_ema = interval if state.interval_ema is None else \
                self.ema_alpha * interval + (1 - self.ema_alpha) * state.interval_ema
        state.last_request = now
        state.waiting_since = now
        self.events.append(("request", now, worker))
        if state.fifo:
            self._enter_others(worker)  # answered from its buffer at the next poll()
            self._touched.add(worker)
        else:
            self._ready[worker] = None
            self._ready_deadline = min(self._ready_deadline, self._deadline(worker))

    def away(self, worker: int) -> None:
        """Record that ``worker`` left the training step (a collective of the script,
        evaluation, the end of its share of the epoch): nobody waits for it until its next
        request. Groups already in its buffer stay there (it executes them when it comes
        back). Ignored under ``"all"``, and for a worker that has left or has an
        outstanding request."""
        state = self._workers[self._check_worker(worker)]
        if (self.policy == "all" or not state.active or state.away
                or state.waiting_since is not None):
            return
        self._leave_others(worker)
        state.away = True
        self._present_count -= 1

    def rejoin(self, worker: int) -> None:
        """Count ``worker`` again after it left (every worker left in a ``join()``, which
        ended; training goes on). Its request interval starts afresh: the time it was gone
        is no step time."""
        state = self._workers[self._check_worker(worker)]
        if state.active:
            return
        state.active = True
        state.away = False
        state.last_request = None
        self._present_count += 1

    def leave(self, worker: int) -> List[Assignment]:
        """Remove ``worker`` from future divisions; return its buffered groups, which it
        must still execute (its group-mates expect it)."""
        state = self._workers[self._check_worker(worker)]
        if state.active:
            if worker in self._ready:
                del self._ready[worker]
                self._ready_deadline = min((self._deadline(w) for w in self._ready),
                                           default=math.inf)
            else:
                self._leave_others(worker)
            if not state.away:
                self._present_count -= 1
        state.active = False
        state.waiting_since = None
        self._touched.discard(worker)
        remaining = list(state.fifo)
        state.fifo.clear()
        return remaining

    def poll(self) -> Dict[int, List[Assignment]]:
        """Run the divisions that are due and return the answers to outstanding requests."""
        reason = None
        if self._ready:
            reason = "all" if self.policy == "all" else self._division_reason()
        if reason is not None:
            members = self.active if self.policy == "all" else sorted(self._ready)
            self.division_reasons[reason] += 1
            self.divided_by_reason[reason] += len(self._ready)
            now = self._clock()
            for _ in range(self.batch):
                self.events.append(("division", now, reason, self._divide(members)))
            for w in self._ready:
                self._enter_others(w)
            self._touched.update(self._ready)
            self._ready.clear()
            self._ready_deadline = math.inf
        answers = {}
        for w in sorted(self._touched):
            state = self._workers[w]
            if state.waiting_since is not None and state.fifo:
                answers[w] = [state.fifo.popleft() for _ in range(min(self.batch, len(state.fifo)))]
                state.waiting_since = None
        self._touched.clear()
        return answers

    # -- internals -----------------------------------------------------------------
    def _check_worker(self, worker: int) -> int:
        return check_int("worker", worker, low=0, high=self.size - 1, high_name="size - 1")

    def _enter_others(self, worker: int) -> None:
        """``worker`` (active) is no longer ready: index its expected next request."""
        state = self._workers[worker]
        state.in_others = True
        state.version += 1
        expected = self._expected_at(worker)
        state.unknown = expected == -math.inf
        if state.unknown:
            self._unknown_others += 1
        else:
            heapq.heappush(self._expected, (expected, state.version, worker))
            if len(self._expected) > 4 * self.size + 64:  # drop stale entries now and then
                self._expected = [e for e in self._expected if self._valid(e)]
                heapq.heapify(self._expected)

    def _leave_others(self, worker: int) -> None:
        state = self._workers[worker]
        if not state.in_others:
            return
        state.in_others = False
        state.version += 1  # its heap entry, if any, is now stale
        if state.unknown:
            self._unknown_others -= 1

    def _valid(self, entry) -> bool:
        state = self._workers[entry[2]]
        return state.in_others and state.version == entry[1]

    def _overdue_at(self, entry) -> float:
        expected, _, worker = entry
        return expected + (OVERDUE_INTERVALS - 1) * self._workers[worker].interval_ema

    def _earliest_other(self) -> float:
        """The earliest expected request among the others whose speed is known and that
        are not overdue (an overdue one is dropped from the index until it asks again)."""
        now = self._clock()
        while self._expected and (not self._valid(self._expected[0])
                                  or self._overdue_at(self._expected[0]) <= now):
            heapq.heappop(self._expected)
        return self._expected[0][0] if self._expected else math.inf

    def _next_overdue(self) -> float:
        """When the earliest expected other becomes overdue (inf if none is expected)."""
        if self._earliest_other() == math.inf:
            return math.inf
        return self._overdue_at(self._expected[0])

    def _must_have_company(self, worker: int) -> bool:
        if self.group_size == 1:
            return False
        state = self._workers[worker]
        company_may_come = self._unknown_others > 0 or self._earliest_other() < math.inf
        return (state.lone_rounds >= self.max_isolation and company_may_come
                and self._clock() < state.waiting_since + self.company_wait_s)

    def _deadline(self, worker: int) -> float:
        state = self._workers[worker]
        if state.interval_ema is None:
            wait = self.first_wait_s
        else:
            wait = min(self.max_wait_s, self.window_fraction * state.interval_ema)
        return state.waiting_since + wait

    def _expected_at(self, worker: int) -> float:
        state = self._workers[worker]
        if state.last_request is None or state.interval_ema is None:
            return -math.inf  # unknown speed: assume it is about to ask
        return state.last_request + state.interval_ema

    def _division_reason(self) -> Optional[str]:
        """Why the ready workers should be divided now (one of ``DIVISION_REASONS``), or
        None while they should wait."""
        if len(self._ready) == 1 and self._must_have_company(next(iter(self._ready))):
            return None
        if self._present_count == len(self._ready):
            return "everyone ready"  # nobody else to wait for
        deadline = self._ready_deadline
        if self._clock() >= deadline:
            return "window ended"
        if self._unknown_others == 0 and self._earliest_other() > deadline:
            return "nobody expected sooner"
        return None

    def _divide(self, members: List[int]) -> List[Group]:
        if self.ranks_per_node is None:
            groups = divide(self._shuffled(members), self.group_size)
        else:
            groups = divide_by_node(members, self.ranks_per_node, self.group_size,
                                    self._shuffled,
                                    self.divisions % self.cross_node_every == 0,
                                    self._may_stay_alone)
        for group in groups:
            assignment = (self._next_seq, group)
            self._next_seq += 1
            lone = len(group) == 1
            for w in group:
                state = self._workers[w]
                state.fifo.append(assignment)
                state.lone_rounds = state.lone_rounds + 1 if lone else 0
                if state.waiting_since is not None:
                    self._touched.add(w)
        self.divisions += 1
        return groups

    def _may_stay_alone(self, worker: int) -> bool:
        return self._workers[worker].lone_rounds < self.max_isolation

    def _shuffled(self, members: Sequence[int]) -> List[int]:
        return self._rng.permutation(np.asarray(members, dtype=np.int64)).tolist()
