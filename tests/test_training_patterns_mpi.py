"""Runs tests/mpi/mpi_training_patterns.py under mpiexec."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [2, 4])
def test_training_patterns(nprocs):
    run_pytest_under_mpi("mpi_training_patterns.py", nprocs, timeout=240)
