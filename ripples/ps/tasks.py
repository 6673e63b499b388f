"""Micro-batch tasks of a clock, who computes them, and exactly-once accounting (pure).

Used by the elastic-parallelism policy (EPSP, ``epsp.py``) and by the FlexRR-lite baseline
(``flexrr.py``); the parameter server 0 keeps the ``TaskBoard`` and answers claims, so every
claim is decided in one place, one message at a time.

The global batch of clock ``c`` is cut into ``tasks_per_clock`` tasks ``(c, j)``. When a
clock opens, its task ids are dealt to the workers as consecutive runs by the current
*shares*. A worker claims its own tasks from the front of its queue, a few at a time
(``claim(..., count)``), and starts only tasks it has claimed: a claim is the owner's
confirmation that it will start them. When its queue is empty and it would block (the
staleness gate does not let it start its next clock), it may *steal* the last unclaimed
task of another worker's queue: in the oldest clock it waits for that has a victim, else
in a later clock up to its own (moving work off a straggler's next clocks shortens the
waits to come; without this, a straggler that claims a few tasks ahead has nothing left
to move in the clock it is computing, and slack would never move anything). A task is
claimed at most once, by construction: a claim and a steal of the same task are two
messages to the same server, and the second finds it gone; a task stays stealable until
its owner's claim reaches the server, and once claimed it is out of reach. A push names
the tasks whose gradients it carries; ``complete`` refuses a task that the pusher did
not claim or that was already completed. A clock is complete when all of its tasks are.

Choices where the published description is silent, and why:

- Time per task is the worker's own measurement (between two of its tasks' starts, so
  waiting is excluded), smoothed by an EMA; a worker never measured counts as the mean of
  the measured ones (or 1 s when none is).
- *Straggler projection*: a worker's projected remaining time in a clock is its unclaimed
  tasks times its time per task. A steal happens only when the victim's projection exceeds
  the pioneer's time for one task by the threshold, i.e. when moving the task shortens the
  clock; the victim is the worker with the largest projection (``rule="projection"``). A
  pioneer may ask while it still computes ``ahead`` tasks of its own (so that the answer
  travels meanwhile); the move must then beat ``1 + ahead`` of its task times.
  FlexRR-lite uses ``rule="most_remaining"`` instead: the worker with the most unclaimed
  tasks, any time it has more than one, without time measurements.
- *Rebalancing*: the first clock opened once every worker has a measured time is
  rebalanced, then every ``rebalance_every`` clocks after it. The shares before are a
  guess (equal), so waiting ``rebalance_every`` clocks to replace them would run those
  clocks at the straggler's pace (transfers recover little of it: the straggler has
  claimed most of its share by the time a pioneer asks). Shares follow speed, rounded to
  whole tasks so that the projected clock time (the largest share times its worker's
  time per task) is as short as possible: each task goes, one by one, to the worker that
  would finish it first. This is proportional to speed up to rounding; largest-remainder
  rounding of the proportional shares can leave a slow worker one task that alone
  outlasts everyone else's share (8 workers, one 3x slow, 24 tasks: 2 tasks of 3 s
  against 3-4 tasks of 1 s). At least one task per worker, so that every worker stays
  measured; the sum stays ``tasks_per_clock``, so the global batch per clock is
  constant.
- Clocks are opened in order, each with the shares current when it opens.
"""
from __future__ import annotations

import collections
import dataclasses
from typing import Deque, Dict, List, Optional, Sequence, Set, Tuple

EMA_ALPHA = 0.3
RULES = ("projection", "most_remaining")

Task = Tuple[int, int]


def balanced_shares(task_times: Sequence[float], total: int, minimum: int = 1) -> List[int]:
    """Integers summing to ``total``, each at least ``minimum``, that minimize the largest
    ``share * task_time`` (each task in turn to the worker that would finish it first, ties
    to the lowest index). Raises ValueError if ``total < minimum * len(task_times)``."""
    n = len(task_times)
    if total < minimum * n:
        raise ValueError(f"tasks_per_clock={total} cannot give {n} workers {minimum} each")
    shares = [minimum] * n
    for _ in range(total - minimum * n):
        w = min(range(n), key=lambda v: ((shares[v] + 1) * task_times[v], v))
        shares[w] += 1
    return shares


def deal(shares: Sequence[int]) -> List[List[int]]:
    """Task ids ``0..sum-1`` as consecutive runs, run ``w`` of length ``shares[w]``."""
    out, start = [], 0
    for share in shares:
        out.append(list(range(start, start + share)))
        start += share
    return out


@dataclasses.dataclass
class ClockTasks:
    """One clock's tasks: unclaimed queues per worker, claims and completions."""

    queues: List[Deque[int]]
    claimed: Dict[int, int] = dataclasses.field(default_factory=dict)
    done: Set[int] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class TaskBoard:
    """Shares, per-worker time per task and the open clocks (see the module docstring)."""

    num_workers: int
    tasks_per_clock: int
    staleness: int
    rebalance_every: Optional[int]
    rule: str = "projection"
    threshold: float = 0.2
    shares: List[int] = dataclasses.field(default_factory=list)
    task_time: Dict[int, float] = dataclasses.field(default_factory=dict)
    clocks: Dict[int, ClockTasks] = dataclasses.field(default_factory=dict)
    opened: int = 0
    last_rebalance: Optional[int] = None  # the clock that opened with the latest rebalance
    stats: Dict[str, object] = dataclasses.field(default_factory=lambda: {
        "transfers": 0, "claims": 0, "rebalances": 0, "shares_log": [], "transfer_log": []})

    def __post_init__(self):
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {list(RULES)}, got {self.rule!r}")
        if not self.shares:
            self.shares = balanced_shares([1.0] * self.num_workers, self.tasks_per_clock)


def observe(board: TaskBoard, worker: int, seconds: float) -> None:
    """Record that ``worker`` took ``seconds`` for one task."""
    previous = board.task_time.get(worker)
    board.task_time[worker] = seconds if previous is None else \
        (1 - EMA_ALPHA) * previous + EMA_ALPHA * seconds


def time_per_task(board: TaskBoard, worker: int) -> float:
    if worker in board.task_time:
        return board.task_time[worker]
    known = list(board.task_time.values())
    return sum(known) / len(known) if known else 1.0


def rebalance_due(board: TaskBoard, clock: int) -> bool:
    """Does ``clock`` open with shares rebalanced? Once every worker is measured, at the
    first clock opened after that, then every ``rebalance_every`` clocks."""
    if not board.rebalance_every or clock == 0 or len(board.task_time) < board.num_workers:
        return False
    last = board.last_rebalance
    return last is None or clock - last >= board.rebalance_every


def open_through(board: TaskBoard, clock: int) -> None:
    """Open every clock up to ``clock``, rebalancing when ``rebalance_due``."""
    while board.opened <= clock:
        c = board.opened
        if rebalance_due(board, c):
            times = [time_per_task(board, w) for w in range(board.num_workers)]
            board.shares = balanced_shares(times, board.tasks_per_clock)
            board.last_rebalance = c
            board.stats["rebalances"] += 1
        board.stats["shares_log"].append((c, list(board.shares)))
        board.clocks[c] = ClockTasks([collections.deque(run) for run in deal(board.shares)])
        board.opened += 1


def claim(board: TaskBoard, worker: int, clock: int, count: int = 1) -> List[Task]:
    """Up to ``count`` next tasks of ``worker``'s own share of ``clock``, in order; fewer (or
    none) when the rest of its share is claimed (by it or moved to others). ``worker``
    must start only tasks returned here or by ``steal``."""
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count!r}")
    open_through(board, clock)
    tasks = board.clocks[clock]
    queue = tasks.queues[worker]
    granted = []
    while queue and len(granted) < count:
        j = queue.popleft()
        tasks.claimed[j] = worker
        granted.append((clock, j))
    board.stats["claims"] += 1
    return granted


def unclaimed(board: TaskBoard, worker: int, clock: int) -> int:
    """How many tasks of ``worker``'s own share of ``clock`` nobody has claimed yet."""
    open_through(board, clock)
    return len(board.clocks[clock].queues[worker])


def projected_remaining(board: TaskBoard, clock: int) -> List[float]:
    """Straggler projection: each worker's unclaimed tasks in ``clock`` times its time per
    task."""
    queues = board.clocks[clock].queues
    return [len(q) * time_per_task(board, w) for w, q in enumerate(queues)]


def steal(board: TaskBoard, worker: int, clock: int, rounds_complete: int,
          ahead: int = 0) -> Optional[Task]:
    """A task moved to ``worker``, which has claimed its share of ``clock`` and would block:
    it may start clock ``clock + 1`` only once ``rounds_complete >= clock + 1 - staleness``.
    ``ahead``: tasks ``worker`` computes before it can start the moved one. The task comes
    from the oldest clock in ``[rounds_complete, clock]`` where a move shortens that
    clock. Returns None when it would not block or no move shortens any of them."""
    open_through(board, clock)
    if rounds_complete >= clock + 1 - board.staleness:
        return None  # it would not block
    # The clocks it waits for first; then later ones up to its own, whose moved tasks
    # shorten the waits to come.
    for c in range(rounds_complete, clock + 1):
        victim = _victim(board, worker, c, ahead)
        if victim is not None:
            tasks = board.clocks[c]
            j = tasks.queues[victim].pop()
            tasks.claimed[j] = worker
            board.stats["transfers"] += 1
            board.stats["transfer_log"].append((c, j, victim, worker))
            return c, j
    return None


def _victim(board: TaskBoard, worker: int, clock: int, ahead: int) -> Optional[int]:
    queues = board.clocks[clock].queues
    others = [w for w in range(board.num_workers) if w != worker and queues[w]]
    if not others:
        return None
    if board.rule == "most_remaining":
        victim = max(others, key=lambda w: (len(queues[w]), -w))
        return victim if len(queues[victim]) > 1 else None
    remaining = projected_remaining(board, clock)
    victim = max(others, key=lambda w: (remaining[w], -w))
    if remaining[victim] > (1 + board.threshold) * (1 + ahead) * time_per_task(board, worker):
        return victim
    return None


def complete(board: TaskBoard, worker: int, clock: int, ids: Sequence[int]) -> bool:
    """Mark ``worker``'s computed tasks of ``clock`` done; True when the clock is complete.

    Raises ValueError naming the task when one was not claimed by ``worker`` or was
    already completed (it would be applied twice).
    """
    tasks = board.clocks.get(clock)
    if tasks is None:
        raise ValueError(f"worker {worker} completed tasks of clock {clock}, never opened")
    for j in ids:
        if tasks.claimed.get(j) != worker:
            raise ValueError(f"task ({clock}, {j}) completed by worker {worker} but claimed by "
                             f"{tasks.claimed.get(j)!r}")
        if j in tasks.done:
            raise ValueError(f"task ({clock}, {j}) completed twice (worker {worker})")
        tasks.done.add(j)
    return len(tasks.done) == board.tasks_per_clock


def stragglers(finish: Sequence[float], threshold: float) -> List[int]:
    """Workers whose projected finish exceeds the median of the others' by more than
    ``threshold`` (a fraction)."""
    out = []
    for w, mine in enumerate(finish):
        others = sorted(f for v, f in enumerate(finish) if v != w)
        if not others:
            continue
        middle = len(others) // 2
        median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
        if mine > (1 + threshold) * median:
            out.append(w)
    return out
