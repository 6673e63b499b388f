"""Schedules and the Group Generator service under real MPI at 2 and 4 ranks."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [2, 4])
def test_schedules_under_mpi(nprocs):
    run_pytest_under_mpi("mpi_schedule_service.py", nprocs, timeout=120)
