"""What of a Group Generator a checkpoint keeps, and how a new generator takes it back.

Kept: the random state of the divisions (a resumed run draws the groups an uninterrupted
run would have drawn next, not those of its first steps again), the group and division
counters, and each worker's request-interval EMA (its speed: a resumed run waits for the
workers it knew to be slow as briefly as before, from its first request on instead of
after two). Not kept: what belongs to the processes that ran (buffered groups, outstanding
requests, the times of the last requests), which a restarted job does not have.
"""
from __future__ import annotations

from .generator import GroupGenerator


def generator_state(generator: GroupGenerator) -> dict:
    """A picklable snapshot of ``generator`` (see the module docstring)."""
    return {"size": generator.size,
            "rng": generator._rng.bit_generator.state,
            "next_seq": generator._next_seq,
            "divisions": generator.divisions,
            "interval_ema": [w.interval_ema for w in generator._workers]}


def restore_generator_state(generator: GroupGenerator, state: dict) -> None:
    """Make ``generator`` go on from ``state`` (from :func:`generator_state`).

    Raises ValueError, changing nothing, when ``state`` was saved for another number of
    workers: its speeds would belong to other ranks.
    """
    if state.get("size") != generator.size:
        raise ValueError(f"the group generator's checkpoint is of {state.get('size')} workers, "
                         f"this generator has {generator.size}: resume with "
                         f"{state.get('size')} ranks, or load the optimizer state without its "
                         "'ripples' entry to start the schedule afresh")
    emas = list(state["interval_ema"])
    generator._rng.bit_generator.state = state["rng"]
    # Never back: a rank must see its groups' sequence numbers increase, also when a state
    # older than the groups already handed out is loaded into a running generator.
    generator._next_seq = max(generator._next_seq, int(state["next_seq"]))
    generator.divisions = int(state["divisions"])
    for worker, ema in zip(generator._workers, emas):
        worker.interval_ema = ema
