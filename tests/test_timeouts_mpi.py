"""Error paths that must end in bounded time, run under mpiexec."""
from mpi_launch import run_pytest_under_mpi

# Ranks that never call stand in for dead ones by sleeping through the wait: that needs the
# strict rule (with the liveness check a sleeping rank is busy, and is waited for).
STRICT = {"RIPPLES_WAIT_FOR_BUSY_PEERS": "0"}


def test_missing_member_times_out():
    run_pytest_under_mpi("mpi_timeouts.py", 3, timeout=90,
                         env=STRICT | {"RIPPLES_TIMEOUT_S": "2"})


def test_control_tree_deeper_than_one_level():
    run_pytest_under_mpi("mpi_control_tree.py", 5, timeout=180, env=STRICT | {"RIPPLES_TIMEOUT_S": "3"})
