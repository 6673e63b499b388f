"""The contract every group schedule implements, and argument checks shared by them.

A schedule answers, for one rank, "which groups do I P-Reduce with after local step
``step``?" as ``(seq, group)`` pairs: ``group`` is a sorted tuple of ranks containing this
rank and ``seq`` is a global sequence number. Per rank the sequence numbers strictly
increase, and any two ranks see the groups they share in the same order; executing groups
in that order is what makes decentralized training free of waiting cycles.
"""
from __future__ import annotations

import abc
from typing import List, Tuple

Group = Tuple[int, ...]
Assignment = Tuple[int, Group]

KINDS = ("static", "random", "generator", "generator-node", "adpsgd")
POLICIES = ("ready", "all")


class Schedule(abc.ABC):
    """Groups for one rank, step after step.

    Lifecycle: ``groups_for_step(step)`` after every local optimizer step, ``leave()`` once
    when the rank stops training (it returns the pairs it must still execute), then
    ``close()`` (idempotent; releases threads and messages).
    """

    kind = ""  # the name make_schedule knows it by; a schedule of the user's has its class name
    # Whether the groups of a step are a function of the step, so that all ranks must reach
    # each step together (static, random). A schedule that forms groups from the ranks that
    # ask (the generator) sets False.
    lockstep = True

    def __init__(self, rank: int, size: int):
        self.rank = rank
        self.size = size
        self._left = False

    def settings(self) -> dict:
        """What the groups of a step depend on, besides the step: a position (step count)
        saved under one set of settings means other groups under another, so a resumed run
        checks them (:func:`ripples.schedule.resume.check_resume`). Subclasses add theirs."""
        return {"schedule": self.kind or type(self).__name__, "size": self.size,
                "rank": self.rank}

    def state(self) -> dict:
        """What a checkpoint must keep beyond the step count to go on as an uninterrupted
        run would (picklable); empty for the schedules that are functions of the step."""
        return {}

    def restore(self, state: dict) -> None:
        """Go on from ``state`` (what ``state()`` returned, maybe on another rank)."""

    @abc.abstractmethod
    def groups_for_step(self, step: int) -> List[Assignment]:
        """The ``(seq, group)`` pairs to execute after local step ``step``, in execution
        order. May be empty (no communication this step)."""

    def away(self) -> None:
        """This rank left the training step for a while (a collective of the script,
        evaluation, the end of its share of an epoch): a schedule that forms groups from the
        ranks that ask stops waiting for it until it asks again. Nothing to do for the
        others."""

    def leave(self) -> List[Assignment]:
        """Stop receiving groups; return the pairs already assigned that must still run.

        Schedules computed without communication (static, random, adpsgd) cannot tell other
        ranks, so with them every rank must run the same number of steps; they return [].
        """
        self._left = True
        return []

    def rejoin(self) -> None:
        """Take part again after a ``join()`` that every rank completed (training goes on
        after a join, as in Horovod: one join per epoch of uneven work)."""
        self._left = False

    def close(self) -> None:
        """Release resources. Safe to call more than once."""
        self._left = True

    def abandon(self) -> None:
        """Stop at once without talking to other ranks (some died): release what can be
        released locally. The schedule cannot be used afterwards."""
        self._left = True

    def _check_step(self, step: int) -> None:
        if self._left:
            raise ValueError(f"rank {self.rank} has left the schedule; groups_for_step() "
                             "cannot be called after leave() or close()")
        check_int("step", step, low=0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def check_int(name: str, value, low: int | None = None, high: int | None = None,
              high_name: str = "") -> int:
    """Return ``value`` if it is an int within ``[low, high]``; otherwise raise naming it."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__} {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = []
        if low is not None:
            bounds.append(f">= {low}")
        if high is not None:
            bounds.append(f"<= {high_name} ({high})" if high_name else f"<= {high}")
        raise ValueError(f"{name} must be {' and '.join(bounds)}, got {value}")
    return value


def check_world(rank: int, size: int) -> None:
    """Validate ``rank`` and ``size`` of the world a schedule is built for."""
    check_int("size", size, low=1)
    check_int("rank", rank, low=0, high=size - 1, high_name="size - 1")


def check_group_size(group_size: int, size: int) -> None:
    check_int("group_size", group_size, low=1, high=size, high_name="size")


def check_choice(name: str, value, valid) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}, got {value!r}")
