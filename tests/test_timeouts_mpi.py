"""Error paths that must end in bounded time, run under mpiexec."""
from mpi_launch import run_pytest_under_mpi


def test_missing_member_times_out():
    run_pytest_under_mpi("mpi_timeouts.py", 3, timeout=90, env={"RIPPLES_TIMEOUT_S": "2"})
