"""Runs tests/mpi/mpi_flat_parameters.py under mpiexec."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_flat_parameters(nprocs):
    run_pytest_under_mpi("mpi_flat_parameters.py", nprocs, timeout=240)
