"""``ripples.torch.lockstep_watch``: a collective of the script on every rank in every step
is noticed once, on rank 0 (pure logic; the runtime is a stand-in holding what it reads)."""
import warnings

import pytest

from ripples.torch.lockstep_watch import STEPS, LockstepWatch, lockstep_run

WORLD = (0, 1, 2, 3)


class Runtime:
    def __init__(self, rank, size=4):
        self.rank, self.size = rank, size
        self.world_group = tuple(range(size))
        self.script_collective_hooks = []


def steps(watch, runtime, count, group=WORLD):
    for _ in range(count):
        for hook in runtime.script_collective_hooks:
            hook(group)
        watch.stepped()


def test_the_run_counts_consecutive_steps_and_restarts_after_a_step_without():
    assert [lockstep_run(3, True), lockstep_run(3, False), lockstep_run(0, True)] == [4, 0, 1]


def test_rank_0_warns_once_after_the_run_of_steps():
    runtime = Runtime(0)
    watch = LockstepWatch(runtime, "ripples")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps(watch, runtime, STEPS - 1)
        assert caught == []
        steps(watch, runtime, 3 * STEPS)
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"each of the last {STEPS} training steps" in message
    assert "sync='ripples'" in message and "once per epoch" in message


@pytest.mark.parametrize("group, rank, size", [((0, 1), 0, 4), (WORLD, 1, 4), ((0,), 0, 1)])
def test_no_warning_for_a_subgroup_on_other_ranks_or_alone(group, rank, size):
    runtime = Runtime(rank, size)
    watch = LockstepWatch(runtime, "adpsgd")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        steps(watch, runtime, 2 * STEPS, group=group if size > 1 else (0,))
    assert caught == []


def test_a_step_without_a_collective_starts_the_count_again():
    runtime = Runtime(0)
    watch = LockstepWatch(runtime, "ripples")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            steps(watch, runtime, STEPS - 1)
            watch.stepped()  # a step with no collective of the script
    assert caught == []


def test_close_removes_the_hook():
    runtime = Runtime(0)
    watch = LockstepWatch(runtime, "ripples")
    watch.close()
    assert runtime.script_collective_hooks == []
