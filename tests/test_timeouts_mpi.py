"""Error paths that must end in bounded time, run under mpiexec."""
from mpi_launch import run_pytest_under_mpi


def test_missing_member_times_out():
    run_pytest_under_mpi("mpi_timeouts.py", 3, timeout=90, env={"RIPPLES_TIMEOUT_S": "2"})


def test_control_tree_deeper_than_one_level():
    run_pytest_under_mpi("mpi_control_tree.py", 5, timeout=180, env={"RIPPLES_TIMEOUT_S": "3"})
