"""``sync="ripples"`` and ``sync="adpsgd-sync"``: a local step, then a Partial All-Reduce of the
parameters over the group the schedule gives.

Optimizer state (momentum) stays local. Gradients are never communicated, so
``synchronize()`` has nothing to do and ``step()`` is where ranks meet. The averaged
tensors live in flat buffers (``flat_parameters``), so a sync reduces one tensor per dtype.
"""
from __future__ import annotations

import logging
from typing import Callable, List, Optional, Tuple

import numpy as np
import torch
from mpi4py import MPI

from ripples.core.errors import RanksFailedError
from ripples.ops.partial import grouped_partial_allreduce_
from ripples.schedule import Schedule, make_schedule
from ripples.schedule.resume import check_resume
from ripples.torch.flat_parameters import FlatParameters
from ripples.torch.lockstep_watch import LockstepWatch
from ripples.torch.optimizer_base import WrappedOptimizer
from ripples.torch.ownership import record
from ripples.torch.replicas import ReplicaCheck
from ripples.torch.snapshot import Snapshot

log = logging.getLogger("ripples")

SCHEDULES = ("static", "random", "generator", "generator-node")


def averaged_tensors(named, model) -> List[torch.Tensor]:
    """The tensors decentralized modes average: parameters, then floating buffers of ``model``."""
    return [p.data for _, p in named] + [b for _, b in floating_buffers(model)]


def floating_buffers(model) -> List[Tuple[str, torch.Tensor]]:
    """``(name, buffer)`` for the floating buffers of ``model`` (none without a model)."""
    if model is None:
        return []
    return [(n, b) for n, b in model.named_buffers() if b.dtype.is_floating_point]


def schedule_kind(adpsgd: bool, schedule, hosts_node_by_node: bool = False):
    """The validated ``schedule=`` of a decentralized mode: a schedule name, or the
    ``Schedule`` object given. The default (None) is the Group Generator, node-aware when
    the ranks sit on several hosts numbered host by host (``Runtime.hosts_node_by_node``):
    across hosts its topology-blind groups span hosts and share every host's link."""
    if isinstance(schedule, Schedule):
        return schedule
    if adpsgd:
        if schedule is not None:
            raise ValueError("sync='adpsgd' and 'adpsgd-sync' have their own pairing; leave "
                             "schedule=None")
        return "adpsgd"
    if schedule is None:
        return "generator-node" if hosts_node_by_node else "generator"
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule={schedule!r} is not valid; choose one of "
                         f"{list(SCHEDULES)} or pass a ripples.schedule.Schedule")
    return schedule


def make_mode_schedule(rt, kind, group_size: int, division: str) -> Schedule:
    """The schedule for ``kind`` from :func:`schedule_kind` (a Schedule object as is)."""
    if isinstance(kind, Schedule):
        return kind
    # Each generator schedule gets a communicator of its own (every rank builds the
    # optimizer, so the Dup is collective): a script that builds a second optimizer (a new
    # phase, a GAN's two models) runs a second service, which must not answer the first's
    # requests. The schedule frees it at close().
    generator = kind.startswith("generator")
    return make_schedule(kind, rank=rt.rank, size=rt.size, local_size=rt.local_size,
                         group_size=min(group_size, rt.size), seed=rt.config.seed,
                         comm=rt.service_comm.Dup() if generator else None,
                         timeout_s=rt.config.timeout_s, policy=division, free_comm=generator)


def _first_replaced(current, recorded) -> Optional[str]:
    """The name of the first of the ``current`` buffers that is not the object recorded."""
    for index, (name, tensor) in enumerate(current):
        if index >= len(recorded) or recorded[index][1] is not tensor:
            return name
    return None if len(current) == len(recorded) else recorded[len(current)][0]


def current_layout(flat: FlatParameters, named, model, recorded, rank: int):
    """``(flat, model buffers)`` to average now: ``flat`` and ``recorded`` as they are, or,
    when a tensor no longer views ``flat`` or the model holds a new buffer object, a new
    layout of ``named`` plus the model's current floating buffers."""
    buffers = floating_buffers(model)
    moved = flat.stale() or _first_replaced(buffers, recorded)
    if moved is None:
        return flat, recorded
    log.info("rank %d: %s no longer views its flat buffer; laying the averaged tensors "
             "out again", rank, moved)
    return FlatParameters(list(named) + buffers, previous=flat), buffers


class DecentralizedOptimizer(WrappedOptimizer):
    """Local step, then every ``sync_every`` steps a P-Reduce over the schedule's group.

    The averaged tensors (the parameters of ``named``, then ``model``'s floating buffers)
    are moved, at construction, into one flat buffer per dtype and device: each one's
    ``.data`` becomes a view into its buffer (values unchanged, the same tensor objects),
    so every sync P-Reduces one contiguous tensor per dtype in place, with no fusion-buffer
    copies (16-bit floats still pass through one for their reduction). In-place updates
    (optimizer steps, ``copy_``, ``load_state_dict``) keep the views. A tensor whose
    ``.data`` or whose model buffer is replaced afterwards (e.g.
    ``model.to(torch.float64)``) is noticed at the next sync, which lays the buffers out
    again from the current tensors. Tensors that cannot be moved (sparse, non-contiguous,
    or sharing memory with other tensors) are averaged where they are, in a P-Reduce of
    their own. The views share their buffer's storage: ``torch.save`` of one parameter or
    of a submodule's ``state_dict`` saves the whole buffer unless cloned first. The views
    stay after the optimizer is gone. ``flat``: the current layout (``FlatParameters``).

    ``state_dict()`` saves the local step and synchronization counters, so a run resumed
    from it asks a deterministic schedule (``"static"``, ``"random"``, ``"adpsgd-sync"``) for the
    same groups an uninterrupted run would have used. These schedules are pure functions
    of the step (the random one draws from ``(seed, step)``), so the counters are their
    whole state. The ``"generator"`` schedule forms groups from the order in which ranks
    become ready, so a resumed run restores the parameters, optimizer state and counters
    but not the identical sequence of groups; rank 0's state also keeps the generator's
    random state, counters and the ranks' speeds (``generator_checkpoint``), which rank 0
    restores when it loads it. Each rank saves its own state, with its schedule's settings
    (schedule, world size, group size...); ``load_state_dict`` raises ValueError, naming
    the setting, when they differ from this optimizer's (e.g. another group size). A rank
    may load the state another rank saved (every rank loading rank 0's checkpoint): the
    counters are equal on every rank under the lockstep schedules, and its optimizer state
    (momentum) becomes that rank's.

    ``model.state_dict()`` reads this rank's replica; the first time it does so while the
    replicas may differ, a warning says to call ``hvd.average_model(model)`` on every rank
    before saving or evaluating the model the job trained (``ripples.torch.replicas``).
    """

    def __init__(self, optimizer, named, mode, schedule: Schedule, sync_every: int, model,
                 new_schedule: Optional[Callable[[], Schedule]] = None):
        super().__init__(optimizer, named)
        self.mode = mode
        self.schedule = schedule
        # Builds the schedule for the current world: after dead ranks (fault-tolerant mode)
        # the survivors schedule among themselves. None for a Schedule object the user gave.
        self._new_schedule = new_schedule
        self._sync_base = 0  # the sync count the schedule's step 0 falls on
        self._in_sync = False
        self.schedule_generation = self._runtime.generation
        self._snapshot = Snapshot()
        self._model = model
        self.replicas = ReplicaCheck(model, self._runtime.rank, self._runtime.size,
                                     mode.value)
        self._buffers = floating_buffers(model)
        self.flat = FlatParameters(list(named) + self._buffers)
        self._sync_every = sync_every
        self._syncs = 0
        self._left = False
        self._closed = False
        rt = self._runtime
        # Only where ranks may run at their own pace is a lockstep collective a loss.
        self._lockstep_watch = None if schedule.lockstep else LockstepWatch(rt, mode.value)
        if not schedule.lockstep:
            rt.uneven_steps.add(self)
        rt.join_hooks.append(self.leave)
        rt.away_hooks.append(self._away)
        rt.abandon_hooks.append(self._abandon_schedule)
        rt.rebuild_hooks.append(self._new_world)
        rt.at_shutdown(self.close)
        record(self, named, self.close)

    def step(self, closure=None):
        """The wrapped optimizer's step, then the P-Reduce when one is due (collective
        with the members of this step's group). A step after ``join()`` takes part again
        (``join()`` returns once every rank has joined: a join per epoch of uneven work
        works as in Horovod)."""
        if self._left:
            self._rejoin()
        self._finish_compute()
        result = self.optimizer.step(closure)
        if (self._steps + 1) % self._sync_every == 0:
            try:
                self._sync()
            except RanksFailedError as failure:
                self._restore()
                log.warning("rank %d: the P-Reduce of step %d was lost (%s); training goes on "
                            "with this rank's model", self._runtime.rank, self._steps, failure)
            self._syncs += 1
        self._end_step()
        self.replicas.stepped()
        if self._lockstep_watch is not None:
            self._lockstep_watch.stepped()
        return result

    def _sync(self) -> None:
        rt = self._runtime
        if self._syncs < self._sync_base:
            return  # behind the survivors' common start after a death (see _new_world)
        self._in_sync = True
        try:
            with self.metrics.waiting():  # asking the generator is waiting too
                assignments = self.schedule.groups_for_step(self._syncs - self._sync_base)
            self._run(assignments)
        except RanksFailedError:
            raise
        except Exception as exc:  # e.g. the generator's communicator revoked after a death
            raise rt.raised(exc, self.schedule_generation) from exc
        finally:
            self._in_sync = False

    def _run(self, assignments) -> None:
        if assignments:
            self._check_layout()
            self._save()
        flat = self.flat
        with self.metrics.waiting():
            for _, group in assignments:
                if flat.buffers:
                    grouped_partial_allreduce_(flat.buffers, group)
                # A call of their own, so that no flat buffer is fused with (copied into
                # one fusion buffer alongside) these; detached, as they may require grad.
                if flat.loose:
                    grouped_partial_allreduce_([t.detach() for t in flat.loose], group)
                self.metrics.add_group(len(group))

    def _save(self) -> None:
        """Fault-tolerant mode: keep a copy of the averaged tensors, as an all-reduce cut
        short by a dead member can leave its buffer half summed."""
        if self._runtime.config.fault_tolerant:
            self._snapshot.save(self.flat.buffers + [t.detach() for t in self.flat.loose])

    def _restore(self) -> None:
        """Put back the tensors as they were before the P-Reduce a dead member cut short."""
        self._snapshot.restore(self.flat.buffers + [t.detach() for t in self.flat.loose])

    def _away(self) -> None:
        """This rank left the training step (a collective of the script, the end of its
        share of an epoch): the schedule stops waiting for it until its next sync."""
        if not self._in_sync:
            self.schedule.away()

    def _abandon_schedule(self) -> None:
        """Ranks died: stop the schedule without talking to anyone (a generator's
        communicator is revoked, so ranks waiting for groups learn of the death)."""
        self.schedule.abandon()

    def _new_world(self) -> None:
        """Ranks died and the survivors are on a smaller world: drop the old schedule without
        talking to anyone and build one among the survivors (collective over them, called by
        ``Runtime.recover`` on every survivor in the same order). A rank that has left
        leaves the new schedule too."""
        if self._new_schedule is None:
            raise RanksFailedError(
                f"rank {self._runtime.rank}: DistributedOptimizer(schedule=<a Schedule object>) "
                "cannot go on after ranks died: it was built for the old world. Pass a "
                f"schedule name ({list(SCHEDULES)}) to survive dead ranks")
        self.schedule = self._new_schedule()
        self.schedule_generation = self._runtime.generation
        # Survivors learn of a death in different syncs (a rank whose group held the dead
        # one fails at once; others may sync among themselves first). A lockstep schedule
        # (static, random) needs them at the same step, so they agree on where it starts:
        # the latest next sync of any of them. Ranks behind it train without syncing until
        # there, and every survivor ends its loop at the same step of the new schedule.
        next_sync = np.array([self._syncs + (1 if self._in_sync else 0)], dtype=np.int64)
        if self.schedule.lockstep:  # a buffer all-reduce: the pickled one keeps the GIL
            self._runtime.world.Allreduce(MPI.IN_PLACE, next_sync, op=MPI.MAX)
        self._sync_base = int(next_sync[0])
        if self._left:
            self.schedule.leave()

    def _check_layout(self) -> None:
        """Lay the buffers out again if a tensor left its place since the last sync (its
        ``.data`` was replaced, or the model holds a new buffer object)."""
        self.flat, self._buffers = current_layout(self.flat, self._named, self._model,
                                                  self._buffers, self._runtime.rank)

    def extra_state(self) -> dict:
        state = super().extra_state()
        state["syncs"] = self._syncs
        state["schedule"] = self.schedule.settings()
        schedule_state = self.schedule.state()
        if schedule_state:
            state["schedule_state"] = schedule_state
        return state

    def check_extra_state(self, extra: dict) -> None:
        # A state saved before schedule settings were recorded has nothing to compare.
        if "schedule" in extra:
            check_resume(extra["schedule"], self.schedule.settings())

    def load_extra_state(self, extra: dict) -> None:
        super().load_extra_state(extra)
        self._syncs = int(extra.get("syncs", 0))
        self.schedule.restore(extra.get("schedule_state", {}))

    def _rejoin(self) -> None:
        if self._closed:
            raise RuntimeError(f"rank {self._runtime.rank} called step() after close()")
        self._left = False
        self.schedule.rejoin()

    def leave(self) -> None:
        """Stop training on this rank: run the groups already assigned to it, get no more."""
        if not self._left:
            self._left = True
            self._run(self.schedule.leave())

    def close(self) -> None:
        """Leave (run the groups already assigned to this rank), close the schedule, and
        drop out of ``join()`` and ``shutdown()``. Collective, as ``leave()`` is."""
        if self._closed:
            return
        self._closed = True
        self.leave()
        self.schedule.close()
        self.replicas.close()
        if self._lockstep_watch is not None:
            self._lockstep_watch.close()
        rt = self._runtime
        rt.uneven_steps.discard(self)
        rt.join_hooks.remove(self.leave)
        rt.away_hooks.remove(self._away)
        rt.abandon_hooks.remove(self._abandon_schedule)
        rt.rebuild_hooks.remove(self._new_world)
        rt.cancel_at_shutdown(self.close)
