"""Runs tests/mpi/mpi_sampler.py under mpiexec at 1, 2 and 4 ranks."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_shared_sampler(nprocs):
    run_pytest_under_mpi("mpi_sampler.py", nprocs, timeout=240)
