"""Runs tests/mpi/mpi_async.py under mpiexec at several world sizes."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_async_collectives(nprocs):
    run_pytest_under_mpi("mpi_async.py", nprocs, env={"RIPPLES_TIMEOUT_S": "5"})
