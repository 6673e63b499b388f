"""A rank that dies mid-training: the others learn it within the timeout, nothing hangs."""
import re
import sys
import time

import pytest

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "rank_dies.py")
TIMEOUT_S = 3


def run(sync, schedule, recovery=True):
    start = time.monotonic()
    result = run_mpi([sys.executable, SCRIPT, sync, schedule or "-"], 3, timeout=120,
                     env={"RIPPLES_TIMEOUT_S": str(TIMEOUT_S)}, check=False,
                     mpiexec_args=["--enable-recovery"] if recovery else [])
    return result, time.monotonic() - start


@pytest.mark.parametrize("sync,schedule", [("allreduce", None), ("ripples", "static")])
def test_survivors_raise_naming_the_dead_rank_within_the_timeout(sync, schedule):
    # --enable-recovery keeps Open MPI from killing the survivors, so ripples' own timeout
    # is what they meet.
    result, _ = run(sync, schedule)
    errors = re.findall(r"rank (\d) SURVIVOR-ERROR after ([\d.]+)s: (.*)", result.stdout)
    assert sorted(r for r, _, _ in errors) == ["0", "2"], result.stdout
    for _, seconds, message in errors:
        assert float(seconds) < TIMEOUT_S * 2 + 2
        assert "[1]" in message and "have not called it" in message


def test_generator_survivors_carry_on_or_name_the_dead_rank():
    """The "ready" division stops grouping a rank that no longer asks, so survivors usually
    train on; a group already assigned to the dead rank ends in the timeout error instead."""
    result, _ = run("ripples", "generator")
    for rank in ("0", "2"):
        carried_on = f"rank {rank} carried on past step 100" in result.stdout
        named = re.search(rf"rank {rank} SURVIVOR-ERROR after [\d.]+s: .*\[1\]", result.stdout)
        assert carried_on or named, result.stdout


def test_default_open_mpi_ends_the_whole_job_promptly():
    result, elapsed = run("ripples", "static", recovery=False)
    assert result.returncode != 0
    # Open MPI names the dead process (rank 1 of the job) and its exit code
    assert "exited with non-zero status" in result.stdout
    assert re.search(r"@\d+,1\]", result.stdout) and re.search(r"Exit code:\s+3", result.stdout)
    assert elapsed < 60
