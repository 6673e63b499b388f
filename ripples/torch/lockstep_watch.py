"""A collective of the script on every rank, in every training step: it makes each step
wait for the slowest rank, as all-reduce training does.

Under ``sync="ripples"`` (a generator schedule) and ``sync="adpsgd"`` ranks train at their
own pace. A script that all-reduces a metric every batch (Horovod's ImageNet example does)
gives that up without saying so: every rank waits at that all-reduce for the slowest one.
``LockstepWatch`` notices a run of ``STEPS`` training steps that each held a collective of
the script over the whole world, and warns once, on rank 0, naming the fix.
"""
from __future__ import annotations

import warnings

STEPS = 50  # consecutive steps, each with a world collective of the script, before the warning


def lockstep_run(run: int, collective_this_step: bool) -> int:
    """The number of consecutive steps with a world collective of the script, after one
    more step (pure)."""
    return run + 1 if collective_this_step else 0


class LockstepWatch:
    """Counts the steps of one optimizer of ``runtime`` that held a collective of the script
    on the whole world (``collective(group)``, a ``script_collective_hooks`` entry), and
    warns once on rank 0 after ``STEPS`` of them in a row. ``mode`` names the setting in the
    warning."""

    def __init__(self, runtime, mode: str):
        self._rt = runtime
        self._mode = mode
        self._run = 0
        self._this_step = False
        self.warned = False
        runtime.script_collective_hooks.append(self.collective)

    def collective(self, group: tuple) -> None:
        if tuple(group) == self._rt.world_group:
            self._this_step = True

    def stepped(self) -> None:
        """A training step ended."""
        self._run = lockstep_run(self._run, self._this_step)
        self._this_step = False
        if self._run >= STEPS and not self.warned and self._rt.size > 1:
            self.warned = True
            if self._rt.rank == 0:
                warnings.warn(
                    f"each of the last {STEPS} training steps ran a collective on every rank "
                    "(a metric all-reduced every batch, say): it makes every step wait for "
                    f"the slowest rank, which undoes sync={self._mode!r}. Add such values "
                    "up locally and all-reduce them once per epoch, after the loop",
                    UserWarning, stacklevel=3)

    def close(self) -> None:
        if self.collective in self._rt.script_collective_hooks:
            self._rt.script_collective_hooks.remove(self.collective)
