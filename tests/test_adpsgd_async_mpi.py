"""Runs tests/mpi/mpi_adpsgd_async.py under mpiexec at 1 to 3 ranks, and the failure cases
(tests/mpi/mpi_adpsgd_async_failures.py) at 2 ranks with a 2 s timeout.

Two ranks pair one active with one passive; three make two actives share one passive at
once, the contended case. Four (two such pairs side by side) adds no case to these and
cost the most CPU of the module's runs."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [1, 2, 3])
def test_adpsgd_async(nprocs):
    run_pytest_under_mpi("mpi_adpsgd_async.py", nprocs, timeout=120)


def test_adpsgd_async_failures():
    # A sleeping rank stands for a stuck one: the strict rule, not the liveness check.
    run_pytest_under_mpi("mpi_adpsgd_async_failures.py", 2, timeout=120,
                         env={"RIPPLES_TIMEOUT_S": "2", "RIPPLES_WAIT_FOR_BUSY_PEERS": "0"})
