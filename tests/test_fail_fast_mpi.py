"""An uncaught exception on one rank ends the whole job within seconds (``ripples.comm.
fail_fast``), with its traceback shown once and a non-zero exit status."""
import re
import sys
import time

import pytest

from mpi_launch import TESTS_DIR, run_mpi

SCRIPT = str(TESTS_DIR / "mpi" / "rank_raises.py")
MESSAGE = "ValueError: an error in the training script on rank 1"


@pytest.mark.parametrize("sync", ["allreduce", "ripples"])
def test_an_uncaught_exception_on_one_rank_ends_the_job_within_seconds(sync):
    # A long timeout: without the abort the others would wait for rank 1 for 60 s.
    result = run_mpi([sys.executable, SCRIPT, sync], 4, timeout=120, check=False,
                     env={"RIPPLES_TIMEOUT_S": "60"})
    ended = time.time()
    raised = float(re.search(r"RAISING at ([\d.]+)", result.stdout).group(1))
    assert result.returncode != 0, result.stdout
    assert ended - raised < 5, (ended - raised, result.stdout)
    assert result.stdout.count(MESSAGE) == 1, result.stdout
    assert "rank 1 raised an uncaught ValueError and aborts the job" in result.stdout
    assert "FINISHED" not in result.stdout

