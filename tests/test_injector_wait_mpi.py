"""The slowdown injector scales a rank's own compute, not its wait for slower peers."""
import re
import sys

from mpi_launch import TESTS_DIR, run_mpi


def test_slowdown_scales_compute_not_the_wait_for_peers():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "injector_wait.py")], 2,
                     timeout=120)
    rows = {int(r): (float(s), float(w)) for r, s, w in re.findall(
        r"rank (\d) slowed_ms_per_step (\S+) wait_ms_per_step (\S+)", result.stdout)}
    slowed, waited = rows[0]
    # Rank 0 waits about 120 - 60 = 60 ms a step for rank 1. Its own 20 ms scaled 3x adds
    # 40 ms; scaling the wait too would add twice the wait on top (>= 100 ms).
    assert waited > 30, result.stdout
    assert slowed < 55, result.stdout
