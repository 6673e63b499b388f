"""Runs the failure cases of asynchronous AD-PSGD (tests/mpi/mpi_adpsgd_async_failures.py)
at 2 ranks with a 2 s timeout; tests/mpi/mpi_adpsgd_async.py itself runs at 1 to 3 ranks in
tests/test_conformance_mpi.py (two ranks pair one active with one passive, three make two
actives share one passive at once)."""
from mpi_launch import run_pytest_under_mpi


def test_adpsgd_async_failures():
    # A sleeping rank stands for a stuck one: the strict rule, not the liveness check.
    run_pytest_under_mpi("mpi_adpsgd_async_failures.py", 2, timeout=120,
                         env={"RIPPLES_TIMEOUT_S": "2", "RIPPLES_WAIT_FOR_BUSY_PEERS": "0"})
