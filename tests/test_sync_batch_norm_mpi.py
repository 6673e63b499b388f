"""Runs tests/mpi/mpi_sync_batch_norm.py under mpiexec at several world sizes."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 4])
def test_sync_batch_norm(nprocs):
    run_pytest_under_mpi("mpi_sync_batch_norm.py", nprocs)
