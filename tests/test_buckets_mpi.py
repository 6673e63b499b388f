"""Gradient buckets: zero-copy views, overlap with backward, re-planning, join and the
watchdog, at 2 and 3 ranks."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_buckets(nprocs):
    run_pytest_under_mpi("mpi_buckets.py", nprocs, timeout=120,
                         env={"RIPPLES_BUCKET_BYTES": "65536", "RIPPLES_TIMEOUT_S": "3",
                              # a rank that stops stepping (sleeps) stands for a dead one
                              "RIPPLES_WAIT_FOR_BUSY_PEERS": "0"})
