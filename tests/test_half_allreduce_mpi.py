"""16-bit wire all-reduce (ripples.ops.half_allreduce): accuracy, bytes handed to MPI,
joined ranks and 16-bit gradient buckets, at 2 and 3 ranks."""
import pytest

from mpi_launch import run_pytest_under_mpi


@pytest.mark.parametrize("nprocs", [2, 3])
def test_half_allreduce(nprocs):
    run_pytest_under_mpi("mpi_half_allreduce.py", nprocs, timeout=180,
                         env={"RIPPLES_BUCKET_BYTES": "65536"})
