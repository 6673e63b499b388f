"""What a resumed schedule needs: the step alone for the computed schedules, and a check
that refuses a saved position from other schedule settings, naming the setting."""
import pytest

from ripples.schedule import AdpsgdSchedule, RandomSchedule, StaticSchedule
from ripples.schedule.resume import check_resume


def test_the_computed_schedules_resume_from_the_step_alone():
    # A schedule that ran steps 0..9 and one built afresh (a restarted process) give the
    # same groups from step 10 on: nothing but the step carries over.
    for make in (lambda: StaticSchedule(3, 8, 4), lambda: RandomSchedule(3, 8, 3, seed=7),
                 lambda: AdpsgdSchedule(3, 8, seed=7)):
        running, fresh = make(), make()
        for step in range(10):
            running.groups_for_step(step)
        assert [running.groups_for_step(s) for s in range(10, 30)] == \
            [fresh.groups_for_step(s) for s in range(10, 30)]


def test_same_settings_resume_on_any_rank():
    check_resume(RandomSchedule(1, 4, 2, seed=0).settings(),
                 RandomSchedule(1, 4, 2, seed=0).settings())
    check_resume(RandomSchedule(0, 4, 2, seed=0).settings(),  # rank 0's state on rank 2
                 RandomSchedule(2, 4, 2, seed=0).settings())


@pytest.mark.parametrize("saved, current, named, fix", [
    (RandomSchedule(1, 4, 2, 0), StaticSchedule(1, 4, 2), "schedule='random'", "'random'"),
    (RandomSchedule(1, 4, 2, 0), RandomSchedule(1, 8, 2, 0), "size=4", "mpiexec -n 4"),
    (RandomSchedule(1, 4, 2, 0), RandomSchedule(1, 4, 4, 0), "group_size=2", "group_size=2"),
    (RandomSchedule(1, 4, 2, 0), RandomSchedule(1, 4, 2, 5), "seed=0", "RIPPLES_SEED"),
    (StaticSchedule(1, 4, 2), StaticSchedule(1, 4, 4), "local_size=2", "2 ranks per node"),
    (AdpsgdSchedule(1, 4, 0), RandomSchedule(1, 4, 2, 0), "schedule='adpsgd'", "adpsgd-sync"),
])
def test_other_settings_are_refused_naming_the_setting_and_the_fix(saved, current, named, fix):
    with pytest.raises(ValueError, match="saved with " + named) as error:
        check_resume(saved.settings(), current.settings())
    assert fix in str(error.value)


def test_another_world_is_named_before_the_ranks_it_renumbers():
    with pytest.raises(ValueError, match="size=8 but is loaded with size=4"):
        check_resume(RandomSchedule(5, 8, 2, 0).settings(), RandomSchedule(1, 4, 2, 0).settings())
