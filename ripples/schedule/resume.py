"""Whether a schedule position saved in a checkpoint may resume under the current schedule.

A decentralized optimizer saves its step count with the ``settings()`` of its schedule. The
groups of a step depend on those settings, so a saved count means the same groups only
under the same settings. The saving rank is not one of them: the lockstep schedules
(static, random, AD-PSGD pairs) have every rank at the same count, and the generator's
groups do not depend on it, so a rank may resume from what another rank saved (Horovod's
pattern: rank 0 saves one checkpoint, every rank loads it).
"""
from __future__ import annotations

# The order in which differences are named: a changed world changes the ranks, and
# another schedule has other settings, so the cause comes first.
_FIRST = ("schedule", "size")
# Recorded, but not a reason to refuse (see the module docstring).
_IGNORED = ("rank",)

_FIXES = {
    "schedule": "build the DistributedOptimizer with the schedule it was saved with "
                "({saved!r}; 'adpsgd' is sync='adpsgd-sync')",
    "size": "resume with {saved} processes (mpiexec -n {saved})",
    "group_size": "build the DistributedOptimizer with group_size={saved}",
    "local_size": "resume with {saved} ranks per node",
    "seed": "set the seed back to {saved} (hvd.init(seed=...) or RIPPLES_SEED)",
}


def check_resume(saved: dict, current: dict) -> None:
    """Raise ValueError if a state saved under schedule settings ``saved`` cannot resume
    under ``current`` (both as ``Schedule.settings()`` returns them).

    The message names the first setting that differs, both values and what to change. A
    deliberate change (say another group size) can still start from a checkpoint: load the
    state without its ``"ripples"`` entry, and the step counters start again from 0.
    """
    names = [n for n in _FIRST if n in saved or n in current]
    names += sorted((set(saved) | set(current)) - set(_FIRST) - set(_IGNORED))
    for name in names:
        old, new = saved.get(name), current.get(name)
        if old != new:
            fix = _FIXES.get(name, "use the setting the state was saved with").format(
                saved=old)
            raise ValueError(f"this optimizer state was saved with {name}={old!r} but is "
                             f"loaded with {name}={new!r}: {fix}")
