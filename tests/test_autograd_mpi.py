"""Runs tests/mpi/mpi_autograd.py (gradients of the collectives) under mpiexec."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_autograd(nprocs):
    run_pytest_under_mpi("mpi_autograd.py", nprocs)
