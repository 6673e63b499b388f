"""An uncaught exception on one rank ends the whole job within seconds (``ripples.comm.
fail_fast``), with its traceback shown once and a non-zero exit status; so does a member
frozen inside a collective's data phase (``ripples.comm.data_watch``)."""
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



def test_a_member_frozen_in_the_data_phase_is_named_and_the_job_ends():
    result = run_mpi([sys.executable, str(TESTS_DIR / "mpi" / "frozen_in_data_phase.py")], 3,
                     timeout=120, check=False, env={"RIPPLES_TIMEOUT_S": "2"})
    ended = time.time()
    frozen = float(re.search(r"FREEZING at ([\d.]+)", result.stdout).group(1))
    assert result.returncode != 0 and "FINISHED" not in result.stdout, result.stdout
    assert "rank(s) [1] (on " in result.stdout and "did not answer a liveness check" in \
        result.stdout, result.stdout
    assert "in the data phase" in result.stdout and "'gradients'" in result.stdout
    # the timeout, the answer bound, the watch's period, and the launcher's teardown
    assert ended - frozen < 15, (ended - frozen, result.stdout)
