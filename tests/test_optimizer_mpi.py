"""Runs tests/mpi/mpi_optimizer.py under mpiexec."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [1, 4])
def test_distributed_optimizer(nprocs):
    run_pytest_under_mpi("mpi_optimizer.py", nprocs, timeout=300)
