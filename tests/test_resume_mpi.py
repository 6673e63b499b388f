"""Exact resume of decentralized training (4 ranks, a saving job then a resuming job, see
tests/mpi/mpi_resume.py): the static and random schedules resume bit for bit; the
generator resumes without deadlock, with the right counters and an averaged model close
to the uninterrupted run's; a state saved by another rank loads (every rank may resume
from rank 0's checkpoint); one saved under other schedule settings is refused, naming the
setting, and nothing of it is loaded."""
import re
import sys

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "mpi_resume.py")
RANKS, STEPS = 4, 12  # STEPS: N of the script, one P-Reduce per step


def lines(out, schedule, label):
    """``{rank: rest of the line}`` of the ``schedule rank R LABEL rest`` lines."""
    found = dict(re.findall(rf"^{schedule} rank (\d) {label} (.*)$", out, re.M))
    assert sorted(found) == [str(r) for r in range(RANKS)], out
    return found


def test_resume_matches_the_uninterrupted_run_and_refuses_other_settings(tmp_path):
    schedules = ["static", "random", "generator"]
    env = {"RIPPLES_TIMEOUT_S": "20"}
    run_mpi([sys.executable, SCRIPT, "save", str(tmp_path), *schedules], RANKS, timeout=90,
            env=env)
    out = run_mpi([sys.executable, SCRIPT, "resume", str(tmp_path), *schedules], RANKS,
                  timeout=150, env=env).stdout
    for schedule in schedules:
        counters = lines(out, schedule, "STEPS")
        assert set(counters.values()) == {f"{STEPS} SYNCS {STEPS}"}, out
        assert set(lines(out, schedule, "FOREIGN").values()) == {"none STEPS 5"}, out
        assert set(lines(out, schedule, "RANK0").values()) == {f"STEPS {STEPS} SYNCS {STEPS}"}, out
        assert set(lines(out, schedule, "UNTOUCHED").values()) == {"1"}, out
        # rank 0's checkpoint keeps the generator's state (random state, counters, speeds)
        has_generator = {str(int(schedule == "generator"))}
        assert set(lines(out, schedule, "GENERATOR_STATE").values()) == has_generator, out
        other = lines(out, schedule, "OTHER")
        assert all(f"saved with schedule='{schedule}' but is loaded with schedule=" in e
                   for e in other.values()), out
        if schedule != "static":
            group = lines(out, schedule, "GROUP")
            assert all(f"group_size=2 but is loaded with group_size={RANKS}" in e
                       for e in group.values()), out
    for schedule in ("static", "random"):
        assert set(lines(out, schedule, "SAME").values()) == {"1"}, out
    # The generator's groups depend on timing: the resumed model is not the same bit for
    # bit, but its rank average must be far closer to the uninterrupted run's than the
    # distance training moved it (a model lost on resume is not).
    for rest in lines(out, "generator", "AVGDIFF").values():
        diff, moved = map(float, re.fullmatch(r"(\S+) MOVED (\S+)", rest).groups())
        assert moved > 0.1 and diff < 0.2 * moved, out
