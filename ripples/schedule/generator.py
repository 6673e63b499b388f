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
  no other active worker is expected (last request + its interval EMA) before that. So
  workers of similar speed meet, a slow worker waits briefly for fast ones (its window is
  long) and fast workers never wait for a slow one (its expected arrival is far away). A
  ready worker alone gets a group of itself only if it has been alone fewer than
  ``max_isolation`` divisions in a row; otherwise it waits for the next worker to become
  ready, which bounds how far its model drifts, but at most ``company_wait_s``: the others
  may be blocked on something the generator cannot see (a collective of the script, a dead
  rank), and progress must not depend on them.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import time
from typing import Callable, Deque, Dict, List, Optional, Sequence

import numpy as np

from .base import (POLICIES, Assignment, Group, check_choice, check_group_size, check_int)


@dataclasses.dataclass
class _Worker:
    fifo: Deque[Assignment] = dataclasses.field(default_factory=collections.deque)
    active: bool = True
    waiting_since: Optional[float] = None  # outstanding request, None if none
    last_request: Optional[float] = None
    interval_ema: Optional[float] = None
    lone_rounds: int = 0  # divisions in a row in which it got a group of itself


def divide(order: Sequence[int], group_size: int) -> List[Group]:
    """Cut ``order`` into consecutive groups of ``group_size``; a trailing group of one
    worker joins the previous group (nobody is left alone unless alone overall)."""
    groups = [list(order[i:i + group_size]) for i in range(0, len(order), group_size)]
    if len(groups) > 1 and len(groups[-1]) == 1:
        groups[-2].extend(groups.pop())
    return [tuple(sorted(g)) for g in groups]


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
        clock: time source in seconds (``time.monotonic``; a simulator passes its own).
    """

    def __init__(self, size: int, group_size: int, seed: int = 0, policy: str = "ready",
                 batch: int = 1, max_isolation: int = 2, window_fraction: float = 0.1,
                 max_wait_s: float = 1.0, first_wait_s: float = 0.2, ema_alpha: float = 0.3,
                 company_wait_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
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
        self._clock = clock
        self._rng = np.random.default_rng(seed)
        self._workers = [_Worker() for _ in range(size)]
        self._next_seq = 0
        self.divisions = 0

    # -- queries -------------------------------------------------------------------
    @property
    def active(self) -> List[int]:
        """Workers that have not left."""
        return [w for w, s in enumerate(self._workers) if s.active]

    def speed_estimate(self, worker: int) -> Optional[float]:
        """The EMA of ``worker``'s request interval in seconds, None before two requests."""
        return self._workers[self._check_worker(worker)].interval_ema

    def next_deadline(self) -> Optional[float]:
        """The time at which ``poll()`` may have something new to answer without any new
        request, or None if only a request or a leave can change anything."""
        ready = self._ready()
        if not ready or self.policy == "all":
            return None
        if len(ready) == 1 and self._must_have_company(ready[0]):
            return self._workers[ready[0]].waiting_since + self.company_wait_s
        return min(self._deadline(w) for w in ready)

    # -- events --------------------------------------------------------------------
    def request(self, worker: int) -> None:
        """Record that ``worker`` asks for groups; the answer comes from ``poll()``."""
        state = self._workers[self._check_worker(worker)]
        if not state.active:
            raise ValueError(f"worker {worker} has left the group generator and cannot request")
        if state.waiting_since is not None:
            raise ValueError(f"worker {worker} already has an outstanding request")
        now = self._clock()
        if state.last_request is not None:
            interval = now - state.last_request
            state.interval_ema = interval if state.interval_ema is None else \
                self.ema_alpha * interval + (1 - self.ema_alpha) * state.interval_ema
        state.last_request = now
        state.waiting_since = now

    def leave(self, worker: int) -> List[Assignment]:
        """Remove ``worker`` from future divisions; return its buffered groups, which it
        must still execute (its group-mates expect it)."""
        state = self._workers[self._check_worker(worker)]
        state.active = False
        state.waiting_since = None
        remaining = list(state.fifo)
        state.fifo.clear()
        return remaining

    def poll(self) -> Dict[int, List[Assignment]]:
        """Run the divisions that are due and return the answers to outstanding requests."""
        ready = self._ready()
        if ready and (self.policy == "all" or self._should_divide(ready)):
            members = self.active if self.policy == "all" else ready
            for _ in range(self.batch):
                self._divide(members)
        answers = {}
        for w, state in enumerate(self._workers):
            if state.waiting_since is not None and state.fifo:
                answers[w] = [state.fifo.popleft() for _ in range(min(self.batch, len(state.fifo)))]
                state.waiting_since = None
        return answers

    # -- internals -----------------------------------------------------------------
    def _check_worker(self, worker: int) -> int:
        return check_int("worker", worker, low=0, high=self.size - 1, high_name="size - 1")

    def _ready(self) -> List[int]:
        return [w for w, s in enumerate(self._workers)
                if s.active and s.waiting_since is not None and not s.fifo]

    def _must_have_company(self, worker: int) -> bool:
        if self.group_size == 1:
            return False
        others = sum(1 for w, s in enumerate(self._workers) if s.active and w != worker)
        state = self._workers[worker]
        return (others > 0 and state.lone_rounds >= self.max_isolation
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

    def _should_divide(self, ready: List[int]) -> bool:
        if len(ready) == 1 and self._must_have_company(ready[0]):
            return False
        ready_set = set(ready)
        others = [w for w, s in enumerate(self._workers) if s.active and w not in ready_set]
        if not others:
            return True
        deadline = min(self._deadline(w) for w in ready)
        if self._clock() >= deadline:
            return True
        return all(self._expected_at(w) > deadline for w in others)

    def _divide(self, members: List[int]) -> None:
        order = self._rng.permutation(np.asarray(members, dtype=np.int64)).tolist()
        for group in divide(order, self.group_size):
            assignment = (self._next_seq, group)
            self._next_seq += 1
            for w in group:
                state = self._workers[w]
                state.fifo.append(assignment)
                state.lone_rounds = state.lone_rounds + 1 if len(group) == 1 else 0
        self.divisions += 1
