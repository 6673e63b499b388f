"""The worker's side of elastic-parallelism synchronous parallel (EPSP) and FlexRR-lite:
``TaskSampler``, the data API through which work can move between workers.

A clock's global batch is ``tasks_per_clock`` micro-batches of ``micro_batch_size``
samples (``tasks.py`` deals, moves and accounts for them on server 0). Iterating a
``TaskSampler`` yields the sample indices of the tasks this worker computes in its current
clock: first its own share, then, once its share is claimed, tasks moved to it from
projected stragglers (server 0 moves one only when the staleness gate would block the
worker), one at a time until one is refused. Each time the loop asks for the next task,
the gradients accumulated in the parameters' ``.grad`` since the previous one are credited
to the previous task (summed per clock, ``.grad`` reset to None). ``step()`` then pushes,
per clock, the sum and the task ids; the servers apply a clock once all its tasks have
arrived, as the mean over tasks, i.e. the gradient of the global batch when the loss is a
mean over the micro-batch.

Claims travel in batches, one request in flight at a time, and never make the loop wait
while it has claimed tasks to compute (``claim_count``). A worker starts only tasks that
server 0 granted it, so a task is never computed twice even when a pioneer asks for it as
the owner reaches it: whichever request server 0 handles first gets it. Choices where the
published description is silent, and why:

- Batch size: a claim round trip ``rtt`` hides behind ``L = ceil(rtt / task time)``
  tasks, so a worker claims up to ``2 L`` tasks whenever it has ``L`` or fewer in hand:
  about one claim per ``L`` tasks instead of one per task. Claimed tasks are out of reach
  of transfers, but the ones a worker would start within a round trip could not move in
  time anyway (a steal is a round trip too). Before anything is measured, ``L = 1``;
  ``2 L`` is at most ``MAX_AHEAD``.
- A pioneer asks for a moved task as it starts its last one, so the answer travels while
  it computes (``tasks.steal``'s ``ahead``); a refusal then costs no waiting. It does not
  ask when the rounds named in server 0's newest answer already open the gate: server 0
  would refuse (it moves tasks only to a worker that would block), after a round trip.
- At that same moment it claims the next clock's first tasks and, with slack (``s >= 1``),
  asks for the pull that ``step()`` will install, under the next clock's gate, so neither
  round trip is waited for after the push. The parameters are then at most one task older
  than those of a pull asked after the push; with ``s = 0`` the gate holds the pull until
  the clock's own pushes are applied, so it is asked in ``step()``.

Sample order: the infinite stream of epochs (each a permutation of ``range(num_samples)``
seeded by ``seed + epoch`` when ``shuffle``, else in order) cut into micro-batches; task
``(c, j)`` is micro-batch ``c * tasks_per_clock + j`` of the stream, whoever computes it.
The stream wraps across epoch ends, so every micro-batch is full.

Contract: every worker runs the same number of clocks, and each clock iterates the sampler
to its end before ``step()`` (a task claimed and never computed would hold its clock back
forever; ``step()`` refuses to push in that case).
"""
from __future__ import annotations

import collections
import math
import time
from typing import Deque, Dict, Iterator, List, Optional, Tuple

import torch

from ..core.errors import RipplesError

# Tasks a worker may hold claimed ahead of the one it computes, at most: bounds what a slow
# link takes out of reach of transfers.
MAX_AHEAD = 8
RTT_ALPHA = 0.3  # EMA weight of the latest claim round trip


def claim_count(in_hand: int, task_s: Optional[float], rtt_s: Optional[float]) -> int:
    """Tasks to claim now, holding ``in_hand`` claimed and not started (see the module
    docstring): 0 while ``in_hand`` covers a round trip, else enough for two."""
    if task_s is None or rtt_s is None:
        cover = 1
    else:
        cover = min(MAX_AHEAD // 2, max(1, math.ceil(rtt_s / max(task_s, 1e-9))))
    return 0 if in_hand > cover else 2 * cover - in_hand


class TaskSampler:
    """Batch sampler of this worker's micro-batches, one clock per iteration.

    ``for indices in TaskSampler(opt, len(dataset), micro_batch_size=32)`` yields lists of
    dataset indices; pass it as ``DataLoader(dataset, batch_sampler=sampler)`` (with
    ``num_workers=0``, so tasks are claimed when the loop reaches them). Between two
    yielded tasks the loop must run the forward and backward pass of exactly that task.

    Arguments:
        optimizer: the ``PSOptimizer`` (``DistributedOptimizer(..., sync="ps",
            policy="epsp" | "flexrr")``).
        num_samples: the dataset's length.
        micro_batch_size: samples per task.
        shuffle, seed: a fresh permutation per epoch, seeded by ``seed + epoch``.

    ``current`` is the ``(clock, task)`` id of the task last yielded.
    """

    def __init__(self, optimizer, num_samples: int, micro_batch_size: int,
                 shuffle: bool = True, seed: int = 0):
        runner = getattr(optimizer, "tasks", None)
        if not isinstance(runner, TaskRunner):
            raise TypeError("TaskSampler needs the optimizer of sync='ps' with "
                            "policy='epsp' or policy='flexrr'")
        for name, value in (("num_samples", num_samples), ("micro_batch_size", micro_batch_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        self.runner = runner
        self.num_samples = num_samples
        self.micro_batch_size = micro_batch_size
        self.shuffle = shuffle
        self.seed = seed
        self.current: Optional[Tuple[int, int]] = None
        self._perm: Dict[int, torch.Tensor] = {}

    def __iter__(self) -> Iterator[List[int]]:
        for task in self.runner.tasks():
            self.current = task
            yield self.indices(*task)

    def indices(self, clock: int, j: int) -> List[int]:
        """The dataset indices of task ``(clock, j)``."""
        first = (clock * self.runner.tasks_per_clock + j) * self.micro_batch_size
        return [int(self._order(k // self.num_samples)[k % self.num_samples])
                for k in range(first, first + self.micro_batch_size)]

    def _order(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perm:
            if len(self._perm) > 2:
                self._perm.pop(min(self._perm))
            if self.shuffle:
                generator = torch.Generator().manual_seed(self.seed + epoch)
                self._perm[epoch] = torch.randperm(self.num_samples, generator=generator)
            else:
                self._perm[epoch] = torch.arange(self.num_samples)
        return self._perm[epoch]


class TaskRunner:
    """Claims, gradient accumulation per clock and pushes for one ``PSOptimizer``; ``ps`` is
    its ``worker_link.ServerLink``."""

    def __init__(self, ps):
        self.ps = ps
        self.tasks_per_clock = ps.spec.tasks_per_clock
        self.sums: Dict[int, List[Optional[torch.Tensor]]] = {}
        self.ids: Dict[int, List[int]] = {}
        self.finished = True  # nothing claimed yet
        self.task_s: Optional[float] = None
        self.rtt_s: Optional[float] = None
        self._began = 0.0
        self.prefetched: Optional[Tuple[int, dict]] = None  # (clock, claim request)
        self.next_pull: Optional[Dict[int, int]] = None  # asked during the last task (slack)
        self.stats = {"tasks": 0, "stolen": 0, "task_log": [], "requests": 0,
                      "claim_wait_s": 0.0}

    def tasks(self) -> Iterator[Tuple[int, int]]:
        """This worker's tasks of its current clock (see the module docstring)."""
        clock = self.ps.clock
        self.finished = False
        in_hand: Deque[Tuple[int, int]] = collections.deque()
        own_left, moves = True, True  # own share not all claimed; no move refused yet
        request = None  # at most one in flight
        if self.prefetched is not None:
            prefetched_clock, request = self.prefetched
            self.prefetched = None
            if prefetched_clock != clock:
                if self._answer(request)[0]:
                    raise RipplesError(f"worker {self.ps.worker} claimed tasks of clock "
                                       f"{prefetched_clock} but runs clock {clock}")
                request = None
        while True:
            # Take an answer once it is there, or wait for it when nothing is in hand.
            if request is not None and (not in_hand or self._arrived(request)):
                granted, left = self._answer(request)
                in_hand.extend(granted)
                if request["steal"]:
                    self.stats["stolen"] += len(granted)
                    moves = bool(granted)
                else:
                    own_left = left > 0
                request = None
            if not in_hand:
                if request is None:
                    if not own_left and not (moves and self._may_block(clock)):
                        break
                    request = self._next_request(clock, 0, own_left, moves, computing=False)
                continue
            task = in_hand.popleft()
            if request is None:
                request = self._next_request(clock, len(in_hand), own_left, moves,
                                             computing=True)
            if not own_left and not in_hand and self.prefetched is None:
                self._ask_for_next_clock(clock)
            self._began = time.monotonic()
            yield task
            self._credit(task)
        self.finished = True

    def _next_request(self, clock: int, in_hand: int, own_left: bool, moves: bool,
                      computing: bool) -> Optional[dict]:
        """The request to send now, if any, holding ``in_hand`` tasks claimed and not started
        (plus the one starting now when ``computing``)."""
        if own_left:
            count = claim_count(in_hand, self.task_s, self.rtt_s)
            return self._request(clock, steal=False, count=count) if count else None
        if moves and in_hand == 0 and self._may_block(clock):
            return self._request(clock, steal=True, ahead=int(computing))
        return None

    def _may_block(self, clock: int) -> bool:
        """Could the staleness gate stop this worker after ``clock``, as far as it knows?
        Rounds only grow, so when the latest answer says no, server 0 would refuse a move
        (``tasks.steal`` moves tasks only to a worker that would block), and asking would
        only cost a round trip."""
        return self.ps.rounds_known < clock + 1 - self.ps.spec.staleness

    def _ask_for_next_clock(self, clock: int) -> None:
        """As this worker starts what it knows to be its last task of ``clock``: claim the
        next clock's first tasks and, with slack, ask for the next clock's pull, so that
        both round trips travel while it computes. The pull carries the gate of clock
        ``clock + 1``, so its answer is one that waiting for it after the push could also
        have got (one task older at most)."""
        self.prefetched = (clock + 1, self._request(
            clock + 1, steal=False, count=claim_count(0, self.task_s, self.rtt_s)))
        if self.ps.spec.staleness >= 1:
            self.next_pull = self.ps.request_pull(after=clock + 1)

    def _credit(self, task) -> None:
        """Add the parameters' gradients to ``task``'s clock and time it."""
        self.task_s = time.monotonic() - self._began
        clock, j = task
        sums = self.sums.setdefault(clock, [None] * len(self.ps.params))
        for i, p in enumerate(self.ps.params):
            if p.grad is not None:
                sums[i] = p.grad.detach().clone() if sums[i] is None else sums[i].add_(p.grad)
                p.grad = None
        self.ids.setdefault(clock, []).append(j)
        self.stats["tasks"] += 1
        self.stats["task_log"].append(task)

    def _request(self, clock: int, steal: bool, count: int = 1, ahead: int = 0) -> dict:
        self.stats["requests"] += 1
        message = {"kind": "task", "sid": self.ps.sid, "w": self.ps.worker, "clock": clock,
                   "steal": steal, "count": count, "ahead": ahead, "task_s": self.task_s}
        return {"rid": self.ps.channel.send(0, message), "steal": steal,
                "sent": time.monotonic(), "answer": None}

    def _arrived(self, request: dict) -> bool:
        if request["answer"] is None:
            request["answer"] = self.ps.channel.poll(0, request["rid"])
        return request["answer"] is not None

    def _answer(self, request: dict) -> Tuple[List[Tuple[int, int]], int]:
        """The tasks granted by ``request`` and the own share's unclaimed count."""
        answer = request["answer"]
        if answer is None:
            began = time.monotonic()
            answer = self.ps.channel.wait(0, request["rid"], 2 * self.ps.timeout_s,
                                          f"worker {self.ps.worker} task claim")
            self.stats["claim_wait_s"] += time.monotonic() - began
        self.ps.rounds_known = max(self.ps.rounds_known, answer.get("rounds", 0))
        rtt = answer["_arrived"] - request["sent"]
        self.rtt_s = rtt if self.rtt_s is None else (1 - RTT_ALPHA) * self.rtt_s + RTT_ALPHA * rtt
        return [tuple(t) for t in answer["tasks"]], answer["left"]

    def step(self, skip: bool) -> None:
        """Push every clock's sums and task ids, advance the clock, pull as the gate says."""
        if not self.finished:
            raise RipplesError("step() before the TaskSampler of this clock was iterated to "
                               "its end: a claimed task would never be computed")
        ps = self.ps
        for clock in sorted(self.ids):
            ps.push_sums(self.sums.pop(clock), {"clock": clock, "tasks": self.ids.pop(clock)},
                         skip)
        ps.clock += 1
        if self.prefetched is None:  # claims ignore the gate: they travel while we pull
            self.prefetched = (ps.clock, self._request(
                ps.clock, steal=False, count=claim_count(0, self.task_s, self.rtt_s)))
        if self.next_pull is not None:
            pull, self.next_pull = self.next_pull, None
            ps.install_pull(pull)
        else:
            ps.pull_now()
