"""Runs the Horovod API conformance module tests/mpi/mpi_horovod_api.py under mpiexec."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [2, 4])
def test_horovod_api(nprocs):
    run_pytest_under_mpi("mpi_horovod_api.py", nprocs, timeout=900,
                         env={"RIPPLES_TIMEOUT_S": "10"})
