"""``sync="ripples"`` and ``sync="adpsgd"``: a local step, then a Partial All-Reduce of the
parameters over the group the schedule gives.

Optimizer state (momentum) stays local. Gradients are never communicated, so
``synchronize()`` has nothing to do and ``step()`` is where ranks meet.
"""
from __future__ import annotations

from typing import List

import torch

from ripples.ops.partial import grouped_partial_allreduce_
from ripples.schedule import Schedule, make_schedule
from ripples.torch.optimizer_base import WrappedOptimizer

SCHEDULES = ("static", "random", "generator")


def averaged_tensors(named, model) -> List[torch.Tensor]:
    """The tensors decentralized modes average: parameters, then floating buffers of ``model``."""
    tensors = [p.data for _, p in named]
    if model is not None:
        tensors += [b for b in model.buffers() if b.dtype.is_floating_point]
    return tensors


def schedule_kind(adpsgd: bool, schedule):
    """The validated ``schedule=`` of a decentralized mode: a schedule name, or the
    ``Schedule`` object given."""
    if isinstance(schedule, Schedule):
        return schedule
    if adpsgd:
        if schedule is not None:
            raise ValueError("sync='adpsgd' has its own pairing; leave schedule=None")
        return "adpsgd"
    kind = "generator" if schedule is None else schedule
    if kind not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not valid; choose one of "
                         f"{list(SCHEDULES)} or pass a ripples.schedule.Schedule")
    return kind


def make_mode_schedule(rt, kind, group_size: int, division: str) -> Schedule:
    """The schedule for ``kind`` from :func:`schedule_kind` (a Schedule object as is)."""
    if isinstance(kind, Schedule):
        return kind
    return make_schedule(kind, rank=rt.rank, size=rt.size, local_size=rt.local_size,
                         group_size=min(group_size, rt.size), seed=rt.config.seed,
                         comm=rt.service_comm, timeout_s=rt.config.timeout_s, policy=division)


class DecentralizedOptimizer(WrappedOptimizer):
    """Local step, then every ``sync_every`` steps a P-Reduce over the schedule's group.

    ``state_dict()`` saves the local step and synchronization counters, so a run resumed
    from it asks a deterministic schedule (``"static"``, ``"random"``, ``"adpsgd"``) for the
    same groups an uninterrupted run would have used. The ``"generator"`` schedule forms
    groups from the order in which ranks become ready, so a resumed run restores the
    parameters, optimizer state and counters but not the identical sequence of groups.
    """

    def __init__(self, optimizer, named, mode, schedule: Schedule, sync_every: int, model):
        super().__init__(optimizer, named)
        self.mode = mode
        self.schedule = schedule
        self._tensors = averaged_tensors(named, model)
        self._sync_every = sync_every
        self._syncs = 0
        self._left = False
        rt = self._runtime
        rt.join_hooks.append(self.leave)
        rt.at_shutdown(self.close)

    def step(self, closure=None):
        """The wrapped optimizer's step, then the P-Reduce when one is due (collective
        with the members of this step's group)."""
        if self._left:
            raise RuntimeError(f"rank {self._runtime.rank} called step() after join()")
        self._finish_compute()
        result = self.optimizer.step(closure)
        if (self._steps + 1) % self._sync_every == 0:
            with self.metrics.waiting():  # asking the generator is waiting too
                assignments = self.schedule.groups_for_step(self._syncs)
            self._run(assignments)
            self._syncs += 1
        self._end_step()
        return result

    def _run(self, assignments) -> None:
        with self.metrics.waiting():
            for _, group in assignments:
                grouped_partial_allreduce_(self._tensors, group)
                self.metrics.add_group(len(group))

    def extra_state(self) -> dict:
        state = super().extra_state()
        state["syncs"] = self._syncs
        return state

    def load_extra_state(self, extra: dict) -> None:
        super().load_extra_state(extra)
        self._syncs = int(extra.get("syncs", 0))

    def leave(self) -> None:
        """Stop training on this rank: run the groups already assigned to it, get no more."""
        if not self._left:
            self._left = True
            self._run(self.schedule.leave())

    def close(self) -> None:
        self.leave()
        self.schedule.close()
