"""The worker's side of elastic-parallelism synchronous parallel (EPSP) and FlexRR-lite:
``TaskSampler``, the data API through which work can move between workers.

A clock's global batch is ``tasks_per_clock`` micro-batches of ``micro_batch_size``
samples (``tasks.py`` deals, moves and accounts for them on server 0). Iterating a
``TaskSampler`` yields the sample indices of the tasks this worker computes in its current
clock: first its own share, claimed one at a time with ``PIPELINE`` claims in flight (the
next claims travel while the current task is computed), then, once its share is claimed,
tasks moved to it from projected stragglers (server 0 moves one only when the staleness
gate would block the worker), also ``PIPELINE`` requests in flight, until one is refused. Each time the
loop asks for the next task, the gradients accumulated in the parameters' ``.grad`` since
the previous one are credited to the previous task (summed per clock, ``.grad`` reset to
None). ``step()`` then pushes, per clock, the sum and the task ids; the servers apply a
clock once all its tasks have arrived, as the mean over tasks, i.e. the gradient of the
global batch when the loss is a mean over the micro-batch.

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
import time
from typing import Dict, Iterator, List, Optional, Tuple

import torch

from ..errors import RipplesError

# Requests kept in flight: a claim is a round trip to server 0, which with link latency
# can take longer than a task; two in flight hide it (and keep at most two of a worker's
# tasks claimed ahead of its computation, out of reach of transfers).
PIPELINE = 2


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
    """Claims, gradient accumulation per clock and pushes for one ``PSOptimizer``."""

    def __init__(self, ps):
        self.ps = ps
        self.tasks_per_clock = ps.spec.tasks_per_clock
        self.sums: Dict[int, List[Optional[torch.Tensor]]] = {}
        self.ids: Dict[int, List[int]] = {}
        self.finished = True  # nothing claimed yet
        self.task_s: Optional[float] = None
        self._began = 0.0
        self.prefetched: List[Tuple[int, int]] = []  # (clock, request id)
        self.stats = {"tasks": 0, "stolen": 0, "task_log": []}

    def tasks(self) -> Iterator[Tuple[int, int]]:
        """This worker's tasks of its current clock (see the module docstring)."""
        clock = self.ps.clock
        self.finished = False
        pending = collections.deque((rid, False) for c, rid in self.prefetched if c == clock)
        self.prefetched = []
        stealing, asking = False, True
        while True:
            while asking and len(pending) < PIPELINE:
                pending.append((self._request(clock, steal=stealing), stealing))
            if not pending:
                break
            rid, was_steal = pending.popleft()
            task = self._answer(rid)
            if task is None:
                # Own share claimed: ask for moved tasks; once a move is refused, stop asking
                # (answers already on their way may still bring tasks).
                asking = asking and not was_steal
                stealing = True
                continue
            if was_steal:
                self.stats["stolen"] += 1
            self._began = time.monotonic()
            yield task
            self._credit(task)
        self.finished = True

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

    def _request(self, clock: int, steal: bool) -> int:
        return self.ps.channel.send(0, {"kind": "task", "sid": self.ps.sid, "w": self.ps.worker,
                                        "clock": clock, "steal": steal, "task_s": self.task_s})

    def _answer(self, rid: int):
        answer = self.ps.channel.wait(0, rid, 2 * self.ps.timeout_s,
                                      f"worker {self.ps.worker} task claim")
        return None if answer["task"] is None else tuple(answer["task"])

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
        # Claim the next clock's first tasks while the pull waits (claims ignore the gate).
        self.prefetched = [(ps.clock, self._request(ps.clock, steal=False))
                           for _ in range(PIPELINE)]
        ps.pull_now()
