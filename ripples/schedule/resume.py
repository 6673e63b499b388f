"""Whether a schedule position saved in a checkpoint may resume under the current schedule.

A decentralized optimizer saves its step count with the ``settings()`` of its schedule. The
groups of a step depend on those settings, so a saved count means the same groups only
under the same settings, and each rank's model is its own: rank r must resume from what
rank r saved.
"""
from __future__ import annotations

# The order in which differences are named: a changed world changes the ranks, and
# another schedule has other settings, so the cause comes first.
_FIRST = ("schedule", "size", "rank")

_FIXES = {
    "schedule": "build the DistributedOptimizer with the schedule it was saved with "
                "({saved!r}; 'adpsgd' is sync='adpsgd-sync')",
    "size": "resume with {saved} processes (mpiexec -n {saved})",
    "rank": "every rank must load the state it saved itself (e.g. name each checkpoint "
            "file after hvd.rank())",
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
    names += sorted((set(saved) | set(current)) - set(_FIRST))
    for name in names:
        old, new = saved.get(name), current.get(name)
        if old != new:
            fix = _FIXES.get(name, "use the setting the state was saved with").format(
                saved=old)
            raise ValueError(f"this optimizer state was saved with {name}={old!r} but is "
                             f"loaded with {name}={new!r}: {fix}")
